"""LBFGS with a closure (scripts/lbfgs_style.py, pytorch/examples time_sequence_prediction
style) under `stepscope run`: several closure evaluations per optimizer step, no token
ids, a no-grad prediction after every step.
"""

from __future__ import annotations

import math

import pytest

from support.script_log import ScriptRun, assert_between_steps_apart, run_under_stepscope

pytestmark = pytest.mark.xdist_group("torch_run")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> ScriptRun:
    return run_under_stepscope(tmp_path_factory.mktemp("lbfgs") / "run", "lbfgs_style.py",
                               timeout=300)


def test_runs_unchanged_and_records_every_optimizer_step(run: ScriptRun) -> None:
    assert run.proc.returncode == 0, run.proc.stderr
    assert run.column("step") == list(range(run.own["done"][0]["steps"]))
    assert run.column("lr") == [s["lr"] for s in run.steps]


def test_loss_and_grad_norm_are_the_closures_first_evaluation(run: ScriptRun) -> None:
    for key in ("loss", "grad_norm"):
        for got, want in zip(run.column(key), [s[key] for s in run.steps], strict=True):
            assert math.isclose(got, want, rel_tol=1e-6), (key, got, want)


def test_phases_inside_the_closure_are_not_counted_twice(run: ScriptRun) -> None:
    t = run.table
    phases = t["forward_s"] + t["backward_s"] + t["optimizer_s"]
    assert (phases <= t["step_time_s"] * 1.0001).all()


def test_prediction_between_steps_is_recorded_apart(run: ScriptRun) -> None:
    between = {e["after_step"]: e["seconds"] for e in run.own["eval"]
               if e["after_step"] < len(run.steps)}
    assert_between_steps_apart(run, between, ("eval_s",))


def test_test_loss_after_each_step_is_the_recorded_eval_loss(run: ScriptRun) -> None:
    # criterion(pred, target) under no_grad right after the prediction: a loss module
    evals = run.evals()
    assert [s for s, _ in evals] == [e["after_step"] for e in run.own["eval"]]
    for (_, metrics), e in zip(evals, run.own["eval"], strict=True):
        assert metrics == {"eval_loss": e["loss"]}
