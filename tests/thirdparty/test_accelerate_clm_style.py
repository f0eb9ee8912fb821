"""accelerate run_clm_no_trainer-style training (scripts/accelerate_clm_style.py) under
`stepscope run`: accumulation 2 through ``accelerator.backward`` with a one-micro-batch
step at each epoch's end, evaluation after every epoch, checked against the script's own
numbers.
"""

from __future__ import annotations

import math

import pytest

from support.script_log import (
    ScriptRun,
    assert_between_steps_apart,
    assert_no_warning,
    run_under_stepscope,
)

pytestmark = pytest.mark.xdist_group("torch_run")


def _run(tmp_path_factory: pytest.TempPathFactory) -> ScriptRun:
    return run_under_stepscope(tmp_path_factory.mktemp("accelerate") / "run",
                               "accelerate_clm_style.py", timeout=300)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> ScriptRun:
    return _run(tmp_path_factory)


def test_runs_unchanged_and_records_every_optimizer_step(run: ScriptRun) -> None:
    assert run.proc.returncode == 0, run.proc.stderr
    assert run.own["done"][0]["steps"] == 6  # 2 epochs x (2 full steps + 1 partial)
    assert run.column("step") == [s["step"] for s in run.steps]
    assert run.column("micro_batches") == [float(s["micro"]) for s in run.steps]


def test_grad_norm_and_lr_are_the_scripts(run: ScriptRun) -> None:
    for got, want in zip(run.column("grad_norm"), [s["grad_norm"] for s in run.steps],
                         strict=True):
        assert math.isclose(got, want, rel_tol=1e-6), (got, want)  # float32 vs float64
    assert run.column("lr") == [s["lr"] for s in run.steps]


def test_loss_of_full_accumulation_steps_is_the_micro_batch_mean(run: ScriptRun) -> None:
    full = [(got, s["loss"]) for got, s in zip(run.column("loss"), run.steps, strict=True)
            if s["micro"] == 2]
    assert len(full) == 4
    for got, want in full:
        assert math.isclose(got, want, rel_tol=1e-6), (got, want)


def test_loss_of_the_partial_last_step_is_its_micro_batch_loss(run: ScriptRun) -> None:
    partial = [(got, s["loss"]) for got, s in zip(run.column("loss"), run.steps, strict=True)
               if s["micro"] == 1]
    assert len(partial) == 2
    for got, want in partial:
        assert math.isclose(got, want, rel_tol=1e-6), (got, want)
    assert math.isclose(run.report["loss_last"], run.steps[-1]["loss"], rel_tol=1e-6)


def test_no_warning_or_critical_finding(run: ScriptRun,
                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    assert_no_warning(run, lambda: _run(tmp_path_factory))


def test_evaluation_time_is_recorded_apart_from_the_step(run: ScriptRun) -> None:
    between = {e["after_step"]: e["seconds"] for e in run.own["eval"]
               if e["after_step"] < len(run.steps)}
    assert between
    assert_between_steps_apart(run, between, ("eval_s",))


def test_eval_loss_is_the_scripts_eval_loss(run: ScriptRun) -> None:
    # the script's torch.mean over float32 values vs a float64 mean of the same losses
    evals = run.evals()
    assert [s for s, _ in evals] == [e["after_step"] for e in run.own["eval"]]
    for (_, metrics), e in zip(evals, run.own["eval"], strict=True):
        assert math.isclose(metrics["eval_loss"], e["loss"], rel_tol=1e-6), (metrics, e)
