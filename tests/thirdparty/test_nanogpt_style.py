"""nanoGPT-style training (scripts/nanogpt_style.py) under `stepscope run`, checked against
the script's own numbers: optimizer steps, mean loss over the accumulated micro-batches,
clip_grad_norm_'s pre-clip norm, lr, tokens per iteration, eval/checkpoint time, MFU.
"""

from __future__ import annotations

import math
import subprocess

import pytest

from stepscope.rundir.store import RunDir
from support.script_log import (
    ScriptRun,
    assert_between_steps_apart,
    assert_no_warning,
    report_json,
    run_under_stepscope,
)
from support.torch_run import BIN, peak_args

pytestmark = pytest.mark.xdist_group("torch_run")

BATCH, BLOCK, ACCUM = 4, 16, 4


def _run(tmp_path_factory: pytest.TempPathFactory) -> ScriptRun:
    tmp = tmp_path_factory.mktemp("nanogpt")
    return run_under_stepscope(tmp / "run", "nanogpt_style.py", "--max-iters", "10",
                               "--out-dir", str(tmp), args=peak_args())


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> ScriptRun:
    return _run(tmp_path_factory)


def test_runs_unchanged_and_records_every_optimizer_step(run: ScriptRun) -> None:
    assert run.proc.returncode == 0, run.proc.stderr
    assert run.own["done"][0]["steps"] == 11  # nanoGPT runs iterations 0..max_iters
    assert run.column("step") == [s["step"] for s in run.steps]


def test_loss_is_the_mean_over_the_steps_micro_batches(run: ScriptRun) -> None:
    own = [s["loss"] for s in run.steps]
    assert len(run.column("loss")) == len(own)
    for got, want in zip(run.column("loss"), own, strict=True):
        assert math.isclose(got, want, rel_tol=1e-6), (got, want)


def test_grad_norm_is_clip_grad_norm_pre_clip_value_and_lr_is_exact(run: ScriptRun) -> None:
    assert run.column("grad_norm") == [s["grad_norm"] for s in run.steps]
    assert run.column("lr") == [s["lr"] for s in run.steps]


def test_tokens_per_step_are_the_scripts_tokens_per_iteration(run: ScriptRun) -> None:
    assert run.column("tokens") == [float(BATCH * BLOCK * ACCUM)] * len(run.steps)
    assert run.column("samples") == [float(BATCH * ACCUM)] * len(run.steps)
    assert run.column("micro_batches") == [float(ACCUM)] * len(run.steps)


def test_no_warning_or_critical_finding(run: ScriptRun,
                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    assert_no_warning(run, lambda: _run(tmp_path_factory))


def test_disabled_grad_scaler_is_plain_fp32_and_the_loss_convention_is_stated(run: ScriptRun
                                                                            ) -> None:
    assert run.report_meta_baseline()["precision"] == "fp32"  # scaler disabled: fp32
    config = RunDir(run.out).read_meta().config
    assert config["loss_convention"].startswith("mean over the optimizer step's micro-batches")


def test_eval_and_checkpoint_time_is_recorded_apart_from_the_step(run: ScriptRun) -> None:
    between = {e["after_step"]: e["seconds"] for e in run.own["eval"]}
    for c in run.own.get("checkpoint", []):
        between[c["after_step"]] += c["seconds"]
    between.pop(0)  # before the first step: no step holds it
    assert_between_steps_apart(run, between, ("eval_s", "checkpoint_s"))


def test_default_flops_count_matmul_parameters_without_embedding_lookups(run: ScriptRun
                                                                         ) -> None:
    env = run.report_meta_environment()
    # tied wte is the lm_head matmul (counted once); wpe is a lookup only
    assert env["flops_per_token"] == 6 * run.own["mfu"][0]["num_params"]
    assert "embedding" in env["flops_convention"]


def test_report_with_palm_convention_reproduces_estimate_mfu(run: ScriptRun) -> None:
    palm = report_json(run.out, "--flops-convention", "palm")
    assert "error" not in palm, palm
    fpt = run.own["mfu"][0]["flops_per_token"]
    env = run.report_meta_environment()
    want = palm["tokens_per_s"] * fpt / env["peak_flops_per_device"]
    assert math.isclose(palm["mfu"], want, rel_tol=1e-9), (palm["mfu"], want)


def test_unrecorded_convention_is_a_one_line_error(run: ScriptRun) -> None:
    proc = subprocess.run([str(BIN / "stepscope"), "report", str(run.out), "--json",
                           "--flops-convention", "bogus"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "recorded: 6n" in proc.stderr


def test_eval_loss_is_the_mean_of_estimate_loss_forwards(run: ScriptRun) -> None:
    # estimate_loss evaluates train and val with equal batches between two steps: the
    # mean of its forwards' losses is the mean of the two (float32 sums in the script)
    evals = run.evals()
    assert [s for s, _ in evals] == [e["after_step"] for e in run.own["eval"]] == [0, 5, 10]
    for (_, metrics), e in zip(evals, run.own["eval"], strict=True):
        assert list(metrics) == ["eval_loss"]
        assert math.isclose(metrics["eval_loss"], (e["train"] + e["loss"]) / 2,
                            rel_tol=1e-6), (metrics, e)
