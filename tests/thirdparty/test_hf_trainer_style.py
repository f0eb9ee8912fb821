"""Hugging Face Trainer (scripts/hf_trainer_style.py) under `stepscope run`, and with
stepscope's own callback: accumulation 2 with a one-micro-batch step at each epoch's end,
evaluation every epoch, checked against the Trainer's own logs.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.rundir.store import RunDir
from support.script_log import (
    THIRDPARTY_SCRIPTS,
    ScriptRun,
    assert_between_steps_apart,
    assert_no_warning,
    printed,
    run_under_stepscope,
)

pytestmark = pytest.mark.xdist_group("torch_run")


def _run(tmp_path_factory: pytest.TempPathFactory) -> ScriptRun:
    tmp = tmp_path_factory.mktemp("hf")
    return run_under_stepscope(tmp / "run", "hf_trainer_style.py", "--out",
                               str(tmp / "hf-out"), timeout=400)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> ScriptRun:
    return _run(tmp_path_factory)


def test_runs_unchanged_and_records_every_optimizer_step(run: ScriptRun) -> None:
    assert run.proc.returncode == 0, run.proc.stderr
    assert run.own["done"][0]["steps"] == 10  # 2 epochs x (4 full steps + 1 partial)
    assert run.column("step") == [s["step"] for s in run.steps]
    assert run.column("micro_batches") == [2.0] * 4 + [1.0] + [2.0] * 4 + [1.0]


def test_loss_and_pre_clip_grad_norm_are_the_trainers_logs(run: ScriptRun) -> None:
    for got, want in zip(run.column("loss"), [s["loss"] for s in run.steps], strict=True):
        assert math.isclose(got, want, rel_tol=1e-6), (got, want)
    assert run.column("grad_norm") == [s["grad_norm"] for s in run.steps]
    assert run.column("lr") == [s["lr"] for s in run.steps]


def test_no_warning_or_critical_finding(run: ScriptRun,
                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    assert_no_warning(run, lambda: _run(tmp_path_factory))


def test_evaluation_time_is_recorded_apart_from_the_step(run: ScriptRun) -> None:
    between = {e["after_step"]: e["seconds"] for e in run.own["eval"]
               if e["after_step"] < len(run.steps)}
    assert between, run.own
    assert_between_steps_apart(run, between, ("eval_s",))


def test_callback_with_default_logging_agrees_with_zero_code(run: ScriptRun,
                                                             tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "STEPSCOPE_RUN_DIR"}
    proc = subprocess.run([sys.executable, str(THIRDPARTY_SCRIPTS / "hf_trainer_style.py"),
                           "--out", str(tmp_path / "hf-out"), "--callback",
                           str(tmp_path / "cb"), "--logging-steps", "500"],
                          capture_output=True, text=True, timeout=400, env=env)
    assert proc.returncode == 0, proc.stderr
    assert printed(proc.stdout)["done"][0]["steps"] == 10
    table, _ = RunDir(tmp_path / "cb").read_steps()
    assert table["step"].tolist() == run.column("step")
    assert table["grad_norm"].tolist() == run.column("grad_norm")
    for got, want in zip(table["loss"].tolist(), run.column("loss"), strict=True):
        assert math.isclose(got, want, rel_tol=1e-6), (got, want)
    own = printed(proc.stdout)["eval"]
    evals = [(e["step"], e["metrics"]) for e in RunDir(tmp_path / "cb").read_events("eval")[0]]
    assert evals == [(e["after_step"], {"eval_loss": e["loss"]}) for e in own]


def test_eval_loss_is_the_trainers_on_evaluate_metric(run: ScriptRun) -> None:
    # recorded at the steps done before each evaluation (the Trainer's global_step)
    assert run.evals() == [(e["after_step"], {"eval_loss": e["loss"]}) for e in run.own["eval"]]
