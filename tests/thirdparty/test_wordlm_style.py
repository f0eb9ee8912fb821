"""word_language_model-style training (scripts/wordlm_style.py) under `stepscope run`:
sequence-first batches, clip_grad_norm_, manual SGD or AdamW (``--use-optimizer``), eval
after each epoch, ``torch.save(model, f)``.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from support.script_log import ScriptRun, assert_between_steps_apart, run_under_stepscope
from support.torch_run import BIN

pytestmark = pytest.mark.xdist_group("torch_run")


@pytest.fixture(scope="module")
def saving(tmp_path_factory: pytest.TempPathFactory) -> ScriptRun:
    """The example's defaults: manual SGD update, whole-model save after validation."""
    tmp = tmp_path_factory.mktemp("wordlm-save")
    return run_under_stepscope(tmp / "run", "wordlm_style.py", cwd=tmp)


@pytest.fixture(scope="module")
def manual(tmp_path_factory: pytest.TempPathFactory) -> ScriptRun:
    """Manual SGD update, no save (so that item 6 is judged on its own)."""
    return run_under_stepscope(tmp_path_factory.mktemp("wordlm-manual") / "run",
                               "wordlm_style.py", "--save=")


@pytest.fixture(scope="module")
def adamw(tmp_path_factory: pytest.TempPathFactory) -> ScriptRun:
    return run_under_stepscope(tmp_path_factory.mktemp("wordlm-adamw") / "run",
                               "wordlm_style.py", "--use-optimizer", "--save=")


def test_whole_model_save_and_reload_work(saving: ScriptRun) -> None:
    assert saving.proc.returncode == 0, saving.proc.stderr[-2000:]
    assert saving.own["reloaded"] and all(r["same"] for r in saving.own["reloaded"])
    assert Path(saving.out.parent / "model.pt").is_file()


def test_manual_sgd_updates_are_the_steps(manual: ScriptRun) -> None:
    assert manual.proc.returncode == 0, manual.proc.stderr[-2000:]
    assert manual.column("step") == list(range(manual.own["done"][0]["steps"]))
    assert manual.column("loss") == [s["loss"] for s in manual.steps]
    assert manual.column("grad_norm") == [s["grad_norm"] for s in manual.steps]


def test_adamw_run_steps_loss_grad_norm_lr_tokens_are_the_scripts(adamw: ScriptRun) -> None:
    assert adamw.proc.returncode == 0, adamw.proc.stderr
    assert adamw.column("step") == list(range(adamw.own["done"][0]["steps"]))
    assert adamw.column("loss") == [s["loss"] for s in adamw.steps]
    assert adamw.column("grad_norm") == [s["grad_norm"] for s in adamw.steps]
    assert adamw.column("lr") == [s["lr"] for s in adamw.steps]
    # the last batch of an epoch is shorter (bptt rows cut at the corpus end)
    assert adamw.column("tokens") == [float(s["tokens"]) for s in adamw.steps]


def test_sequence_first_batches_count_samples_along_dim_1(adamw: ScriptRun) -> None:
    assert adamw.column("samples") == [float(s["samples"]) for s in adamw.steps]
    model = adamw.own["model"][0]
    b = adamw.report_meta_baseline()
    assert (b["micro_batch"], b["seq_len"]) == (model["batch"], model["bptt"])


def test_default_flops_leave_out_the_embedding_lookup(adamw: ScriptRun) -> None:
    model = adamw.own["model"][0]
    env = adamw.report_meta_environment()
    assert env["flops_per_token"] == 6 * (model["num_params"] - model["embedding_params"])


def test_validation_time_is_recorded_apart_from_the_step(adamw: ScriptRun) -> None:
    between = {e["after_step"]: e["seconds"] for e in adamw.own["eval"]
               if e["after_step"] < len(adamw.steps)}
    assert_between_steps_apart(adamw, between, ("eval_s",))


def test_eval_loss_is_evaluates_sequence_weighted_mean(manual: ScriptRun,
                                                      adamw: ScriptRun) -> None:
    # evaluate() weighs criterion(output, targets) by len(data): the tokens of the forward
    for run in (manual, adamw):
        evals = run.evals()
        assert [s for s, _ in evals] == [e["after_step"] for e in run.own["eval"]]
        for (_, metrics), e in zip(evals, run.own["eval"], strict=True):
            assert math.isclose(metrics["eval_loss"], e["loss"], rel_tol=1e-9), (metrics, e)


def test_compare_quality_ledger_reads_the_recorded_eval_loss(manual: ScriptRun,
                                                             adamw: ScriptRun) -> None:
    proc = subprocess.run([str(BIN / "stepscope"), "compare", str(manual.out), str(adamw.out),
                           "--json"], capture_output=True, text=True, timeout=120)
    assert proc.stdout, proc.stderr
    metric = json.loads(proc.stdout)["quality"]["eval:eval_loss"]
    last = manual.own["eval"][-1]["after_step"]
    assert metric["at"] == {"step": last}
    assert math.isclose(metric["a"], manual.own["eval"][-1]["loss"], rel_tol=1e-9)
    assert math.isclose(metric["b"], adamw.own["eval"][-1]["loss"], rel_tol=1e-9)
