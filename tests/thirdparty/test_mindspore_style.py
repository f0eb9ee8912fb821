"""MindSpore tutorial-style scripts (scripts/ms_quickstart_style.py) under `stepscope run`,
unmodified: Model.train with LossMonitor/TimeMonitor, the quick-start PyNative loop, the
same loop with an @jit step, a TrainOneStepCell loop. Each run's records are checked
against the losses the script printed itself; a crash inside Model.train ends `failed`,
and a script with nothing to attach to makes `stepscope run` exit non-zero.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from stepscope.launcher.instrument import NOT_ATTACHED_EXIT
from stepscope.rundir.store import RunDir
from support.script_log import THIRDPARTY_SCRIPTS, ScriptRun, printed, run_under_stepscope
from support.torch_run import BIN, stepscope_run

pytest.importorskip("mindspore")
pytestmark = [pytest.mark.xdist_group("mindspore"), pytest.mark.mindspore, pytest.mark.slow]

SCRIPT = "ms_quickstart_style.py"
STEPS = 6


def _run(tmp_path: Path, *args: str) -> ScriptRun:
    return run_under_stepscope(tmp_path / "run", SCRIPT, *args, timeout=300)


@pytest.fixture(scope="module")
def plain() -> dict[str, ScriptRun]:
    """One run per mode for the whole module (filled on first use)."""
    return {}


def _plain(plain: dict[str, ScriptRun], tmp: pytest.TempPathFactory, mode: str) -> ScriptRun:
    if mode not in plain:
        plain[mode] = _run(tmp.mktemp(mode), mode, "--steps", str(STEPS))
    return plain[mode]


@pytest.mark.parametrize(("mode", "boundary", "execution_mode"), [
    ("model", None, "graph"),
    ("pynative", "optimizer", "pynative"),
    ("jit", "jit step", "pynative+jit"),
    ("cell", "train cell", "pynative"),
    ("graphcell", "graph cell", "graph"),
])
def test_tutorial_script_records_its_own_losses(plain: dict[str, ScriptRun],
                                                tmp_path_factory: pytest.TempPathFactory,
                                                mode: str, boundary: str | None,
                                                execution_mode: str) -> None:
    run = _plain(plain, tmp_path_factory, mode)
    assert run.proc.returncode == 0, run.proc.stderr[-2000:]
    own = [s["loss"] for s in run.steps]
    assert len(own) == STEPS
    assert run.column("step") == list(range(STEPS))
    assert run.column("loss") == own  # the same float32 values, read the same way
    assert run.column("samples") == [16.0] * STEPS
    assert all(abs(v - 1e-2) < 1e-9 for v in run.column("lr"))
    meta = RunDir(run.out).read_meta()
    assert meta.status == "finished"
    assert meta.baseline["execution_mode"] == execution_mode
    # Dense 784->64, 64->64, 64->10 with biases
    assert meta.baseline["num_params"] == 784 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10
    assert meta.config.get("step_boundary") == boundary
    if mode in ("pynative",):  # value_and_grad and the optimizer are timed apart
        assert all(v > 0 for v in run.column("forward_backward_s"))
        assert all(v > 0 for v in run.column("optimizer_s"))
        assert run.column("synced")[0] == 1.0  # step 0 of every 10 is device-synced


def test_compare_names_jit_as_the_differing_variable(
        plain: dict[str, ScriptRun], tmp_path_factory: pytest.TempPathFactory) -> None:
    """A PyNative loop and the same loop with an @jit step differ in execution
    mode; compare must say so rather than call the speed-up 'landed' on no variable."""
    a = _plain(plain, tmp_path_factory, "pynative")
    b = _plain(plain, tmp_path_factory, "jit")
    proc = subprocess.run([str(BIN / "stepscope"), "compare", str(a.out), str(b.out),
                           "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    out = json.loads(proc.stdout)
    assert [(d["variable"], d["a"], d["b"]) for d in out["differing"]] == [
        ("execution_mode", "pynative", "pynative+jit")]


def test_crash_inside_model_train_ends_failed_with_the_exception(tmp_path: Path) -> None:
    run = _run(tmp_path, "model", "--steps", str(STEPS), "--crash-at", "3")
    assert run.proc.returncode == 1
    meta = RunDir(run.out).read_meta()
    assert meta.status == "failed"
    assert meta.error == "ValueError: loss is NAN or INF at step 3"
    assert run.column("step") == [0, 1, 2]  # the step that raised is not a whole step
    crashes, _ = RunDir(run.out).read_events("crash")
    assert [(c["rank"], c["step"]) for c in crashes] == [(0, 3)]


def test_crash_in_a_plain_loop_ends_failed(tmp_path: Path) -> None:
    run = _run(tmp_path, "pynative", "--steps", str(STEPS), "--crash-at", "2")
    assert run.proc.returncode == 1
    meta = RunDir(run.out).read_meta()
    assert (meta.status, meta.error) == ("failed", "ValueError: loss is NAN or INF at step 2")
    assert run.column("step") == [0, 1, 2]  # step 2's update ran before the script raised


def test_script_with_nothing_to_attach_to_exits_non_zero(tmp_path: Path) -> None:
    run = _run(tmp_path, "noboundary", "--steps", "3")
    assert run.proc.returncode == NOT_ATTACHED_EXIT
    [line] = [ln for ln in run.proc.stderr.splitlines() if "stepscope: run" in ln]
    assert "mindspore was imported but no training step was found: looked for Model.train" \
        in line
    assert RunDir(run.out).read_meta().status == "failed"


def test_mixed_precision_loop_records_the_scale_each_step_ran_with(tmp_path: Path) -> None:
    """The amp tutorial's @jit step returns only the loss: overflow comes from the scale's
    backoff, the scale is the one read before the step (not after its adjustment)."""
    inf = [0, 1, 2, 4, 5, 6, 8]
    run = _run(tmp_path, "amp", "--steps", "10", "--inf-steps", ",".join(map(str, inf)))
    assert run.proc.returncode == 0, run.proc.stderr[-2000:]
    assert run.column("loss_scale") == [s["scale"] for s in run.steps]
    assert run.column("overflow") == [float(s["skipped"]) for s in run.steps]
    assert run.column("loss") == [s["loss"] for s in run.steps]
    assert RunDir(run.out).read_meta().baseline["execution_mode"] == "pynative+jit"
    [f] = [f for f in run.report["findings"] if f["rule"] == "health.overflow"]
    assert f["message"].startswith("7 of 10 updates skipped")
    assert not any("no upper bound" in m for m in run.findings("warning", "info"))


def test_pynative_amp_loop_that_skips_the_update_still_closes_each_step(
        tmp_path: Path) -> None:
    """Without @jit, a step whose gradients overflow never calls optimizer(grads): the
    step is closed when the next one starts (the scale fell), its update counted skipped."""
    inf = [1, 2, 5]
    run = _run(tmp_path, "amp-pynative", "--steps", "8", "--inf-steps",
               ",".join(map(str, inf)))
    assert run.proc.returncode == 0, run.proc.stderr[-2000:]
    assert run.column("step") == list(range(8))
    assert run.column("loss") == [s["loss"] for s in run.steps]
    assert run.column("loss_scale") == [s["scale"] for s in run.steps]
    assert run.column("overflow") == [float(s["skipped"]) for s in run.steps]
    meta = RunDir(run.out).read_meta()
    assert meta.config["step_boundary"] == "optimizer + skipped update"
    assert meta.baseline["execution_mode"] == "pynative"
    [f] = [f for f in run.report["findings"] if f["rule"] == "health.overflow"]
    assert f["message"].startswith("3 of 8 updates skipped")


def test_loss_scale_manager_that_disagrees_with_the_optimizer_is_a_finding(
        tmp_path: Path) -> None:
    run = _run(tmp_path, "model", "--steps", "3", "--manager", "fixed", "--opt-scale", "1")
    assert run.proc.returncode == 0, run.proc.stderr[-2000:]
    findings, _ = RunDir(run.out).read_events("finding")
    [f] = [f for f in findings if f["rule"] == "integration.loss_scale_mismatch"]
    assert f["message"].startswith("FixedLossScaleManager scales the loss by 1024 but the "
                                   "optimizer divides the gradients by its loss_scale=1")
    assert run.column("loss_scale") == [1024.0] * 3


def test_dynamic_loss_scale_manager_on_cpu_is_named_when_mindspore_refuses_it(
        tmp_path: Path) -> None:
    run = _run(tmp_path, "model", "--steps", "3", "--manager", "dynamic")
    assert run.proc.returncode == 1
    meta = RunDir(run.out).read_meta()
    assert meta.status == "failed" and meta.error.startswith("ValueError: Only `loss_scale")
    findings, _ = RunDir(run.out).read_events("finding")
    assert [f["rule"] for f in findings] == ["integration.loss_scale_device"]


def test_model_train_data_parallel_under_msrun_records_every_rank(tmp_path: Path) -> None:
    """`stepscope run -- msrun ...`: each worker instruments itself (msrun's scheduler
    process, which runs the script too, is left alone)."""
    import os

    out, logs = tmp_path / "run", tmp_path / "logs"
    port = 20000 + (os.getpid() * 7) % 20000
    proc = stepscope_run(out, str(BIN / "msrun"), "--worker_num=2", "--local_worker_num=2",
                         f"--master_port={port}", f"--log_dir={logs}", "--join=True",
                         str(THIRDPARTY_SCRIPTS / SCRIPT), "model", "--dp", "--steps", "6",
                         env={"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                              "GLOG_v": "3"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = RunDir(out)
    table, _ = run.read_steps()
    assert table.ranks() == [0, 1] and len(run.step_files()) == 2
    for r in (0, 1):
        own = printed((logs / f"worker_{r}.log").read_text())["step"]
        rows = table.rank(r)
        assert rows["step"].tolist() == list(range(6))
        assert rows["loss"].tolist() == [s["loss"] for s in own]
    assert run.read_meta().baseline["num_devices"] == 2
