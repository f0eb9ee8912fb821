"""PyNative profiles split into phases by stepscope's own marks (network and optimizer
hooks during the capture), checked on a real MindSpore 2.10 CPU capture against the
script's direct measurement of each phase. Also: the capture's start/stop sequence raises
none of MindSpore's schedule warnings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stepscope.rundir.store import RunDir
from stepscope.schema import EVENT_KINDS, EventTable
from stepscope.traces import mindspore as msr
from stepscope.traces.mindspore_phases import PHASE_NAMES, phase_busy_us

pytest.importorskip("mindspore")
pytestmark = [pytest.mark.xdist_group("mindspore"), pytest.mark.mindspore, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ms_pynative_loop.py"
OPS = [EVENT_KINDS.index("compute"), EVENT_KINDS.index("comm")]
# The field report's trace said forward 62.8 ms where the forward alone took 26 ms (2.4x):
# every op fell into "forward". Machine load moves the two measurements apart by up to
# ~1.4x here (2 shared cores), so agreement is checked within a factor of 2.
FACTOR = 2.0


def _capture(run_dir: Path) -> tuple[dict[str, Any], str]:
    env = {**os.environ, "GLOG_v": "2"}  # MindSpore warnings on: the test reads them
    p = subprocess.run([sys.executable, str(SCRIPT), str(run_dir), "--steps", "6",
                        "--profile", "2:4", "--direct", "5"], cwd=run_dir.parent, env=env,
                       capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("{")][-1]
    return json.loads(line), p.stdout + p.stderr  # MindSpore logs to both


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], str]:
    run_dir = tmp_path_factory.mktemp("pynative") / "run"
    out, err = _capture(run_dir)
    return run_dir, out, err


def _table(run_dir: Path) -> EventTable:
    [prof] = RunDir.open(run_dir).profile_dirs()
    [t] = msr.read(prof)
    return t


def _phase_ms(t: EventTable) -> dict[str, float]:
    """Fastest profiled step's op time per phase (ms): like the script's direct numbers,
    the minimum is the one least disturbed by other processes."""
    busy = phase_busy_us(t)
    return {p: float(min(row[p] for row in busy.values())) / 1e3
            for p in ("forward", "backward", "optimizer", "other")}


def test_phases_come_from_the_capture_marks(captured: tuple[Path, dict[str, Any], str]) -> None:
    run_dir, _, _ = captured
    t = _table(run_dir)
    assert t.meta["phase_source"].startswith("stepscope phase marks (stepscope_steps.json")
    ops = np.isin(t.kind, OPS)
    assert sorted(set(t.step[ops].tolist())) == [2, 3, 4]
    names = np.asarray(t.names, dtype=object)[t.name]
    phase = t.extra["phase"].astype(int)
    grad_like = ops & np.array(["Grad" in n or "Backprop" in n for n in names])
    assert grad_like.any()
    # every gradient kernel is backward, none is forward; the update is the optimizer's
    assert np.all(phase[grad_like] == PHASE_NAMES.index("backward"))
    fwd = ops & (phase == PHASE_NAMES.index("forward"))
    assert {n.rsplit("/", 1)[-1].split("-op")[0] for n in names[fwd]} >= {
        "Conv2D", "ReLU", "MatMul", "BiasAdd"}
    opt = ops & (phase == PHASE_NAMES.index("optimizer"))
    assert {n.rsplit("/", 1)[-1].split("-op")[0] for n in names[opt]} >= {"SGD"}
    assert not (ops & (phase == PHASE_NAMES.index("other"))).any()  # no op between windows


def _agreement(run_dir: Path, out: dict[str, Any]) -> tuple[bool, Any]:
    trace = _phase_ms(_table(run_dir))
    direct = out["direct_ms"]
    busy = phase_busy_us(_table(run_dir))
    fb = min(r["forward"] + r["backward"] for r in busy.values()) / 1e3
    ok = (direct["forward"] / FACTOR < trace["forward"] < direct["forward"] * FACTOR
          and direct["forward_backward"] / FACTOR < fb < direct["forward_backward"] * FACTOR)
    return ok, (trace, fb, direct)


def test_trace_phases_agree_with_direct_measurement(
        captured: tuple[Path, dict[str, Any], str], tmp_path: Path) -> None:
    """Within FACTOR of the script's direct measurement. The two are taken on different
    steps, so a neighbour's load on one of them moves them apart; the module's capture
    cannot be rerun, so one fresh capture is taken when they disagree."""
    run_dir, out, _ = captured
    ok, seen = _agreement(run_dir, out)
    if not ok:
        again, _ = _capture(tmp_path / "run")
        ok2, seen2 = _agreement(tmp_path / "run", again)
        assert ok2, (seen, seen2)
    trace = _phase_ms(_table(run_dir))
    busy = phase_busy_us(_table(run_dir))
    fb = min(r["forward"] + r["backward"] for r in busy.values()) / 1e3
    # the misattribution put the whole step in forward; here backward has its own share
    assert trace["backward"] > 0.15 * fb, trace


def test_capture_raises_no_schedule_warning(captured: tuple[Path, dict[str, Any], str]) -> None:
    _, _, log = captured
    assert "Incorrect schedule" not in log
    assert "won't be using warmup" not in log
    assert "Start parsing profiling data" in log  # the profiler did save (warnings were on)


def test_report_breakdown_uses_the_archived_profile(
        captured: tuple[Path, dict[str, Any], str]) -> None:
    from click.testing import CliRunner

    import stepscope.cli.report  # noqa: F401  (registers `report`)
    from stepscope.cli import cli

    run_dir, _, _ = captured
    res = CliRunner().invoke(cli, ["report", str(run_dir), "--json", "--no-html"])
    assert res.exit_code == 0, res.output
    sheet = json.loads(res.output)
    assert sheet["phase_source"].startswith("profile ")
    assert "3 profiled steps on 1 rank" in sheet["phase_source"]
    frac = sheet["phase_frac"]
    assert frac["forward"] > 0.1 and frac["backward"] > 0.1
    assert frac["other"] < 0.5  # was "other 99.9%": the records hold no phases here


def test_model_train_in_pynative_is_split_by_the_train_cells_hooks(tmp_path: Path) -> None:
    # Model.train: the capture hooks TrainOneStepCell's network-with-loss and optimizer
    run_dir = tmp_path / "model_train"
    p = subprocess.run([sys.executable, str(SCRIPT), str(run_dir), "--steps", "6",
                        "--profile", "2:4", "--model-train"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Incorrect schedule" not in p.stdout + p.stderr
    t = _table(run_dir)
    assert t.meta["phase_source"].startswith("stepscope phase marks")
    ops = np.isin(t.kind, OPS)
    names = np.asarray(t.names, dtype=object)[t.name]
    phase = t.extra["phase"].astype(int)
    grad_like = ops & np.array(["Grad" in n or "Backprop" in n for n in names])
    assert grad_like.any() and np.all(phase[grad_like] == PHASE_NAMES.index("backward"))
    assert np.all(phase[ops & (names == "Default/Conv2D-op1")] == PHASE_NAMES.index("forward"))
    busy = phase_busy_us(t)
    assert all(r["forward"] > 0 and r["backward"] > 0 and r["optimizer"] > 0
               for r in busy.values())
