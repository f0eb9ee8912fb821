"""Lightning automatic optimization (scripts/lightning_style.py) under `stepscope run`:
``optimizer.step(closure)``, ``gradient_clip_val=0.25``, validation every epoch, checked
against the script's own callback numbers.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from stepscope.rundir.store import RunDir
from support.script_log import (
    ScriptRun,
    assert_between_steps_apart,
    assert_no_warning,
    run_under_stepscope,
)

pytestmark = pytest.mark.xdist_group("torch_run")


def _run(tmp_path_factory: pytest.TempPathFactory) -> ScriptRun:
    return run_under_stepscope(tmp_path_factory.mktemp("lightning") / "run",
                               "lightning_style.py", timeout=300)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> ScriptRun:
    return _run(tmp_path_factory)


def test_runs_unchanged_and_records_every_optimizer_step(run: ScriptRun) -> None:
    assert run.proc.returncode == 0, run.proc.stderr
    assert run.own["done"][0]["steps"] == 18
    assert run.column("step") == [s["step"] for s in run.steps]


def test_loss_and_lr_are_the_scripts(run: ScriptRun) -> None:
    assert run.column("loss") == [s["loss"] for s in run.steps]
    assert run.column("lr") == [s["lr"] for s in run.steps]


def test_grad_norm_is_the_pre_clip_norm_of_this_step(run: ScriptRun) -> None:
    for got, want in zip(run.column("grad_norm"), [s["grad_norm"] for s in run.steps],
                         strict=True):
        assert math.isclose(got, want, rel_tol=1e-6), (got, want)


def test_phases_inside_the_closure_are_not_counted_twice(run: ScriptRun) -> None:
    t = run.table
    phases = t["data_wait_s"] + t["forward_s"] + t["backward_s"] + t["optimizer_s"]
    assert (phases <= t["step_time_s"] * 1.0001).all()
    assert (t["optimizer_s"] < t["forward_s"] + t["backward_s"]).sum() > len(t) // 2


def test_no_warning_or_critical_finding(run: ScriptRun,
                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    assert_no_warning(run, lambda: _run(tmp_path_factory))


def test_validation_time_is_recorded_apart_from_the_step(run: ScriptRun) -> None:
    between = {e["after_step"]: e["seconds"] for e in run.own["eval"]
               if 0 < e["after_step"] < len(run.steps)}
    assert between
    assert_between_steps_apart(run, between, ("eval_s",))


def test_data_wait_is_recorded_from_lightnings_loader(run: ScriptRun) -> None:
    assert np.isfinite(run.table["data_wait_s"]).all()


def test_val_loss_is_lightnings_and_the_sanity_check_is_not_recorded(run: ScriptRun) -> None:
    own = [e for e in run.own["eval"] if not e["sanity"]]
    assert len(own) == 3 and run.own["eval"][0]["sanity"]
    assert run.evals() == [(e["after_step"], {"val_loss": e["loss"]}) for e in own]


def test_the_sanity_check_before_training_is_evaluation_on_step_0(run: ScriptRun) -> None:
    sanity = run.own["eval"][0]
    assert sanity["sanity"] and sanity["after_step"] == 0
    # Lightning's validation loop ran it: eval_s of the step it precedes, no probe
    assert 0.8 * sanity["seconds"] < run.column("eval_s")[0] < 1.2 * sanity["seconds"] + 0.01
    assert "before_training" not in RunDir(run.out).read_meta().config
