"""Shape checks before training (scripts/probe_style.py) under `stepscope run`: no-grad
forwards of the model, in train and in eval mode, before its first training forward are
probes, not evaluation and not part of step 0 (Lightning's sanity check, the
evaluation case, is in test_lightning_style.py; nanoGPT's loss-computing estimate_loss at
iteration 0 in test_nanogpt_style.py)."""

from __future__ import annotations

import math

import pytest

from stepscope.rundir.store import RunDir
from support.script_log import ScriptRun, run_under_stepscope

pytestmark = pytest.mark.xdist_group("torch_run")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> ScriptRun:
    return run_under_stepscope(tmp_path_factory.mktemp("probe") / "run", "probe_style.py")


def test_steps_and_loss_are_the_scripts(run: ScriptRun) -> None:
    assert run.proc.returncode == 0, run.proc.stderr
    assert run.column("step") == [s["step"] for s in run.steps] == list(range(6))
    assert run.column("loss") == [s["loss"] for s in run.steps]


def test_probes_are_recorded_apart_not_as_evaluation(run: ScriptRun) -> None:
    probes = run.own["probe"]
    before = RunDir(run.out).read_meta().config["before_training"]
    assert before["probe_forwards"] == 6  # 3 checks in each mode
    seconds = sum(p["seconds"] for p in probes)
    assert 0.8 * seconds < before["probe_s"] < seconds * 1.01
    assert run.evals() == []
    eval_s = run.column("eval_s")
    assert not eval_s or all(v == 0.0 or math.isnan(v) for v in eval_s)


def test_step_0_leaves_the_probes_out_and_keeps_its_first_batch(run: ScriptRun) -> None:
    probes = sum(p["seconds"] for p in run.own["probe"])
    # step 0 opened at the first fetch, before the probes; its time is that fetch and its
    # own training, not the probes (hundreds of ms of forwards on 4096 rows). Its phases
    # are timed apart from its span, so a span cut too short (the probes taken out twice,
    # or the fetch with them) would be shorter than they are. (The script's own t0..t is
    # no bound: it also holds stepscope's one-off run.json write after step 0, which is
    # left out of every step.)
    step0 = run.column("step_time_s")[0]
    assert step0 < probes / 2, (step0, probes)
    phases = sum(run.column(c)[0] for c in ("data_wait_s", "forward_s", "backward_s",
                                             "optimizer_s"))
    assert run.column("data_wait_s")[0] > 0  # the first batch's fetch is step 0's
    assert step0 >= phases, (step0, phases)
    assert run.column("samples")[0] == 8.0 and run.column("tokens")[0] == 8.0 * 16

