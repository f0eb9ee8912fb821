"""transformers' own examples/pytorch/language-modeling/run_clm_no_trainer.py, run unmodified
under `stepscope run` on tiny local inputs: accelerate with gradient accumulation 2, a
one-micro-batch last step in each of 2 epochs, evaluation with perplexity after each
epoch. stepscope's records are checked against the script's own numbers: its log ("Total
optimization steps", each epoch's perplexity and eval_loss) and what ``--with_tracking
--report_to tensorboard`` writes (each epoch's train_loss, eval_loss, perplexity and
completed steps).

The script logs no per-step loss or gradient norm, so a second run goes through
scripts/observe_training.py, which runs the same file unmodified and prints each optimizer
step's micro-batch losses, pre-step gradient norm and lr, and when the evaluation forwards
ran, from torch's global hooks. Both runs use seed 0 on the CPU and record the same
numbers (checked), so the observer changes nothing measured.

The script is not kept in this repository (third-party code stays out of it). Point
``STEPSCOPE_RUN_CLM_NO_TRAINER`` at a copy; without it, or without ``datasets``, the module
is skipped. The version run: repository evalstate/transformers (a fork of
huggingface/transformers), path examples/pytorch/language-modeling/run_clm_no_trainer.py,
commit 2143f93a301ca3efb8a4f7e499ff515fb45bc016, Apache-2.0 (its header kept),
``check_min_version("4.57.0.dev0")``, sha256 below; it imports nothing transformers 5
removed (``AdamW``, ``send_example_telemetry``). Upstream copies that import those do
not run on transformers 5.
Inputs (scripts/clm_local_assets.py): a word-level tokenizer built with ``tokenizers``, a
2-layer GPT-2 config, 20 training and 48 validation blocks of 16 tokens; the hub is not
contacted (``HF_HUB_OFFLINE``, ``HF_DATASETS_OFFLINE``, a fresh ``HF_HOME``).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.rundir.store import RunDir
from stepscope.schema import StepTable
from support.script_log import (
    THIRDPARTY_SCRIPTS,
    ScriptRun,
    assert_no_warning,
    printed,
    report_json,
)
from support.torch_run import stepscope_run

SCRIPT_ENV = "STEPSCOPE_RUN_CLM_NO_TRAINER"
SHA256 = "6491cd60ef74eb77dc86e1e13668b8312894b7bb6da0a25281c82bf34d9ed9ec"

pytest.importorskip("datasets")
pytest.importorskip("tensorboard")
if not os.environ.get(SCRIPT_ENV):
    pytest.skip(f"{SCRIPT_ENV} is not set (path to transformers' "
                "examples/pytorch/language-modeling/run_clm_no_trainer.py)",
                allow_module_level=True)

pytestmark = pytest.mark.xdist_group("torch_run")

SCRIPT = Path(os.environ[SCRIPT_ENV]).resolve()
EPOCHS = 2
# 20 blocks at batch 4: micro-batches 2, 2, 1 an epoch
MICRO = [2, 2, 1] * EPOCHS


def _args(root: Path, out: str) -> tuple[str, ...]:
    a = root / "assets"
    return ("--train_file", str(a / "train.txt"), "--validation_file",
            str(a / "validation.txt"), "--config_name", str(a / "config"),
            "--tokenizer_name", str(a / "tokenizer"), "--block_size", "16",
            "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "4",
            "--gradient_accumulation_steps", "2", "--num_train_epochs", str(EPOCHS),
            "--learning_rate", "1e-3", "--seed", "0", "--with_tracking",
            "--report_to", "tensorboard", "--output_dir", str(root / out))


def _env(root: Path) -> dict[str, str]:
    return {"HF_HOME": str(root / "hf_home"), "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false"}


def _run(root: Path, name: str, *, observed: bool) -> ScriptRun:
    head = ((str(THIRDPARTY_SCRIPTS / "observe_training.py"),) if observed else ())
    out = root / name
    proc = stepscope_run(out, sys.executable, *head, str(SCRIPT),
                         *_args(root, f"{name}_out"), env=_env(root), timeout=400, cwd=root)
    table = RunDir(out).read_steps()[0] if (out / "steps").is_dir() else StepTable.empty()
    return ScriptRun(proc, printed(proc.stdout), out, table, report_json(out))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("run_clm")
    proc = subprocess.run([sys.executable, str(THIRDPARTY_SCRIPTS / "clm_local_assets.py"),
                           str(root / "assets")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert printed(proc.stdout)["assets"] == [{"train_blocks": 20, "validation_blocks": 48}]
    return root


@pytest.fixture(scope="module")
def plain(root: Path) -> ScriptRun:
    return _run(root, "plain", observed=False)


@pytest.fixture(scope="module")
def observed(root: Path) -> ScriptRun:
    return _run(root, "observed", observed=True)


def _tracked(root: Path, name: str) -> dict[str, list[tuple[int, float]]]:
    """The script's own tensorboard scalars: {tag: [(step, value), ...]} (float32)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(root / f"{name}_out" / "clm_no_trainer"))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
            for tag in acc.Tags()["scalars"]}


def _logged_epochs(stderr: str) -> list[tuple[int, float, float]]:
    """(epoch, perplexity, eval_loss) from the script's "epoch N: perplexity: P eval_loss: L"."""
    return [(int(e), float(p), float(x)) for e, p, x in re.findall(
        r"epoch (\d+): perplexity: (\S+) eval_loss: (\S+)", stderr)]


def test_the_script_is_the_published_file() -> None:
    assert hashlib.sha256(SCRIPT.read_bytes()).hexdigest() == SHA256, SCRIPT


def test_optimizer_steps_are_the_scripts(root: Path, plain: ScriptRun) -> None:
    assert plain.proc.returncode == 0, plain.proc.stderr[-3000:]
    total = re.findall(r"Total optimization steps = (\d+)", plain.proc.stderr)
    assert total == ["6"]
    assert plain.column("step") == list(range(6))
    assert plain.column("micro_batches") == [float(m) for m in MICRO]
    # completed_steps at each epoch's end, as the script logged it
    assert [int(v) for _, v in _tracked(root, "plain")["step"]] == [3, 6]


def test_each_epochs_train_loss_is_the_mean_of_its_recorded_steps(root: Path,
                                                                   plain: ScriptRun) -> None:
    # the script's train_loss: every micro-batch's loss times its batch size (4 each),
    # summed over the epoch in float32, over the samples; stepscope's per-step loss is the
    # mean of the step's micro-batches, so weighting by micro_batches recovers it
    loss, micro = plain.column("loss"), plain.column("micro_batches")
    tracked = _tracked(root, "plain")["train_loss"]
    assert [s for s, _ in tracked] == [3, 6]
    for epoch, (_, want) in enumerate(tracked):
        k = slice(3 * epoch, 3 * epoch + 3)
        got = sum(x * m for x, m in zip(loss[k], micro[k], strict=True)) / sum(micro[k])
        assert math.isclose(got, want, rel_tol=1e-6), (epoch, got, want)


def test_loss_per_step_is_the_micro_batch_mean_partial_steps_too(observed: ScriptRun) -> None:
    assert observed.proc.returncode == 0, observed.proc.stderr[-3000:]
    own = observed.steps
    assert [s["micro"] for s in own] == MICRO
    for got, s in zip(observed.column("loss"), own, strict=True):
        # a mean of float32 losses taken in float64 on both sides
        assert math.isclose(got, s["loss"], rel_tol=1e-12), (got, s)
    assert math.isclose(observed.report["loss_last"], own[-1]["losses"][0], rel_tol=1e-12)


def test_grad_norm_and_lr_are_what_each_step_applied(observed: ScriptRun) -> None:
    for got, s in zip(observed.column("grad_norm"), observed.steps, strict=True):
        assert math.isclose(got, s["grad_norm"], rel_tol=1e-6), (got, s)
    assert observed.column("lr") == [s["lr"] for s in observed.steps]


def test_the_observer_changes_nothing_measured(plain: ScriptRun, observed: ScriptRun) -> None:
    for col in ("step", "micro_batches", "loss", "grad_norm", "lr", "tokens", "samples"):
        assert plain.column(col) == observed.column(col), col


def test_eval_loss_and_perplexity_are_the_scripts(root: Path, plain: ScriptRun) -> None:
    logged = _logged_epochs(plain.proc.stderr)
    assert [e for e, _, _ in logged] == [0, 1]
    tracked = _tracked(root, "plain")
    evals = plain.evals()
    # one eval event per epoch, at the script's completed_steps
    assert [s for s, _ in evals] == [s for s, _ in tracked["eval_loss"]] == [3, 6]
    for (_, metrics), (_, perplexity, eval_loss) in zip(evals, logged, strict=True):
        # the script: torch.mean over float32 per-sample losses; stepscope: a float64 mean
        assert math.isclose(metrics["eval_loss"], eval_loss, rel_tol=1e-6), (metrics, eval_loss)
        assert math.isclose(math.exp(metrics["eval_loss"]), perplexity, rel_tol=1e-6)


def test_evaluation_is_booked_as_eval_not_step_time(observed: ScriptRun) -> None:
    steps = observed.column("step")
    rows = {k: i for i, k in enumerate(steps)}
    own_t = {s["step"]: s["t"] for s in observed.steps}
    mid = [e for e in observed.own["eval"] if e["after_step"] < len(observed.steps)]
    assert [e["after_step"] for e in mid] == [3] and mid[0]["forwards"] == 12
    e = mid[0]
    window = e["end"] - e["start"]  # first evaluation forward's start to the last's end
    i = rows[3]  # the 4th step (0-based 3) opened at step 3's boundary
    booked = observed.column("eval_s")[i]
    # booked: the step's time from its boundary to the last evaluation forward's end
    assert 0.95 * window <= booked <= e["end"] - own_t[3] + 0.05, (booked, window)
    # the step after it: the script's interval less the evaluation (0.8: the script's
    # timestamps sit a little after stepscope's boundaries, by a varying amount under load)
    assert observed.column("step_time_s")[i] < own_t[4] - own_t[3] - 0.8 * window
    assert sum(v for v in observed.column("eval_s") if v == v) == booked


def test_no_warning_or_critical_finding(root: Path, plain: ScriptRun) -> None:
    assert_no_warning(plain, lambda: _run(root, "again", observed=False))
