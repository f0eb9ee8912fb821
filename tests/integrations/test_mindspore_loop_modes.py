"""LoopRecorder told its step functions finds which run compiled (`@jit`) and records the
execution mode per function, so `compare` names the difference between a PyNative loop
and the same loop with an `@jit` step (real MindSpore 2.10 CPU; tests/scripts/
ms_loop_modes.py, checked against its own printed losses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.rundir.store import RunDir
from support.script_log import printed
from support.torch_run import BIN

pytest.importorskip("mindspore")
pytestmark = [pytest.mark.xdist_group("mindspore"), pytest.mark.mindspore, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ms_loop_modes.py"


def _run(run_dir: Path, *args: str) -> list[float]:
    p = subprocess.run([sys.executable, str(SCRIPT), str(run_dir), *args],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "GLOG_v": "3"})
    assert p.returncode == 0, p.stderr[-2000:]
    return [s["loss"] for s in printed(p.stdout)["step"]]


def test_loop_recorder_finds_the_jit_step_and_compare_names_it(tmp_path: Path) -> None:
    plain, jit = tmp_path / "plain", tmp_path / "jit"
    runs = {"plain": (plain, _run(plain)), "jit": (jit, _run(jit, "--jit"))}
    for run_dir, own in runs.values():
        table, _ = RunDir.open(run_dir).read_steps()
        assert table["loss"].tolist() == own and len(own) == 4
    m_plain, m_jit = (RunDir.open(d).read_meta() for d in (plain, jit))
    assert m_plain.baseline["execution_mode"] == "pynative"
    assert m_jit.baseline["execution_mode"] == "pynative+jit"
    assert m_plain.config["function_modes"] == {"train_step": "pynative",
                                                "eval_step": "pynative"}
    assert m_jit.config["function_modes"] == {"train_step": "jit", "eval_step": "pynative"}
    proc = subprocess.run([str(BIN / "stepscope"), "compare", str(plain), str(jit),
                           "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    out = json.loads(proc.stdout)
    assert [(d["variable"], d["a"], d["b"]) for d in out["differing"]] == [
        ("execution_mode", "pynative", "pynative+jit")]
