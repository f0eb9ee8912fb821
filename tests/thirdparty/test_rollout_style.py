"""No-grad forwards of the trained model before every step (scripts/rollout_style.py: an RL
rollout each iteration) are the loop's own work, not evaluation: after 3 steps in a row
with them, stepscope counts them in the step; an evaluation with a loss between the same
steps stays ``eval_s`` (before this, every such rollout was booked as eval and
left out of step time and throughput).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from stepscope.integrations.torch import between
from stepscope.integrations.torch.evalloss import EvalLosses
from stepscope.integrations.torch.pending import StepData
from stepscope.rundir.store import RunDir
from support.script_log import ScriptRun, assert_no_warning, run_under_stepscope

pytestmark = pytest.mark.xdist_group("torch_run")


def _step_with(evals: EvalLosses, run: between.LosslessRun, t0: float,
               segments: list[tuple[float, object]], step: int = 0
               ) -> tuple[StepData, dict[str, object] | None]:
    """Open a step at ``t0`` and book eval forwards ending at each ``(t_end, loss)``,
    each after one 0.1 s loader fetch of 4 samples; then its first training forward."""
    d = StepData(t_start=t0)
    for t_end, loss in segments:
        d.data_wait += 0.1
        d.loader_batches += 1
        d.loader_samples += 4.0
        assert between.book(d, "eval", t_end)
        between.attach(d, evals.add(loss, 1.0))
    return d, between.settle(d, evals, run, step)


def test_lossless_forwards_count_in_the_step_once_they_recur() -> None:
    evals, run = EvalLosses(), between.LosslessRun()
    for i in range(between.RECUR - 1):  # not yet a pattern: booked as evaluation
        d, note = _step_with(evals, run, 10.0 * i, [(10.0 * i + 2.0, None)])
        assert d.extra == {"eval_s": pytest.approx(2.0)} and d.t_start == 10.0 * i + 2.0
        assert d.data_wait == 0.0 and note is None
    # the third step in a row: a rollout (no loss), an evaluation with a loss, a rollout
    d, note = _step_with(evals, run, 100.0,
                         [(101.0, None), (103.0, torch.tensor(2.5)), (103.5, None)], step=7)
    # the rollouts' 1.0 + 0.5 s and their fetches are the step's again; the evaluation's
    # 2.0 s (its fetch included) stays eval
    assert d.extra == {"eval_s": pytest.approx(2.0)}
    assert d.t_start == pytest.approx(102.0)
    assert (d.data_wait, d.loader_batches, d.loader_samples) == (pytest.approx(0.2), 2, 8.0)
    assert note == {"from_step": 7, "note": between.RECUR_NOTE}
    assert evals.take() == (2.5, 1)  # the evaluation's loss alone
    # a step without them resets the count; a loss module's loss makes one evaluation
    _step_with(evals, run, 200.0, [])
    entry = evals.add(None, 1.0)
    d = StepData(t_start=300.0)
    assert between.book(d, "eval", 301.0)
    between.attach(d, entry)
    evals.set_last(nn.functional.mse_loss(torch.ones(2), torch.zeros(2)))
    assert between.settle(d, evals, run, 8) is None
    assert d.extra == {"eval_s": pytest.approx(1.0)} and run.steps == 0


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> ScriptRun:
    return _run(tmp_path_factory)


def _run(tmp_path_factory: pytest.TempPathFactory) -> ScriptRun:
    return run_under_stepscope(tmp_path_factory.mktemp("rollout") / "run",
                               "rollout_style.py", timeout=300)


def test_steps_and_loss_are_the_scripts(run: ScriptRun) -> None:
    assert run.proc.returncode == 0, run.proc.stderr
    assert run.column("step") == [s["step"] for s in run.steps] == list(range(10))
    assert run.column("loss") == [s["loss"] for s in run.steps]


def test_rollouts_are_booked_as_eval_until_they_recur_then_in_the_step(run: ScriptRun) -> None:
    config = RunDir(run.out).read_meta().config
    # step 0's rollout is a probe (before the first training forward: firststep); steps
    # 1 and 2 book theirs as eval; from step 3 they are the step's
    assert config["between_steps"]["from_step"] == 3
    # and the sheet says so, where a reader of its step time looks
    assert [n for n in run.report["notes"] if "recurring no-grad forwards" in n] == [
        "step time from step 3 includes recurring no-grad forwards (a rollout or probe "
        "before every step), booked apart before it"]
    eval_s, step_time = run.column("eval_s"), run.column("step_time_s")
    own = {s["step"]: s for s in run.steps}
    evals = {e["after_step"]: e["seconds"] for e in run.own["eval"]}
    assert sorted(evals) == [4, 8]
    for k in (1, 2):
        rollout = own[k]["rollout"]
        # 10 ms of slack each way: a scheduler slice lost between the script's own timestamps
        # and stepscope's boundaries (a loaded host) moves the booked span by that much
        assert 0.9 * rollout - 0.01 < eval_s[k] < 1.2 * rollout + 0.01, (k, eval_s[k], rollout)
    for k in range(3, 10):
        interval = own[k]["t"] - own[k - 1]["t"]
        booked = eval_s[k] if eval_s[k] == eval_s[k] else 0.0
        if k in evals:  # the evaluation alone, not the rollout after it
            assert 0.9 * evals[k] - 0.01 < booked < 1.2 * evals[k] + 0.01, (k, booked, evals[k])
        else:
            assert booked == 0.0, (k, booked)
        # the step holds its rollout: its span is the script's interval less the evaluation
        assert step_time[k] > own[k]["rollout"], (k, step_time[k], own[k]["rollout"])
        assert math.isclose(step_time[k] + booked, interval, rel_tol=0.1, abs_tol=0.02), \
            (k, step_time[k], booked, interval)


def test_the_evaluations_loss_is_recorded_not_the_rollouts(run: ScriptRun) -> None:
    assert run.evals() == [(e["after_step"], {"eval_loss": e["loss"]})
                           for e in run.own["eval"]]


def test_no_warning_or_critical_finding(run: ScriptRun,
                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    assert_no_warning(run, lambda: _run(tmp_path_factory))
