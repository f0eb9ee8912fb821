"""A run profiled with `stepscope run --profile-steps`: the profiler's own steps
and memory never feed the memory, stall or throughput rules; the capture shows in
report.html; the hooks mark forward, backward and optimizer in the capture, so
`stepscope trace` splits the phases as the live records do.

A real `stepscope run` of tests/scripts/torch_plain.py (PyTorch on the CPU).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from stepscope.rundir.store import RunDir
from support.browser import embedded, offline_page
from support.torch_run import python_script, stepscope_run

STEPSCOPE = str(Path(sys.executable).parent / "stepscope")


def _json(*args: str) -> dict:  # type: ignore[type-arg]
    proc = subprocess.run([STEPSCOPE, *args, "--json"], capture_output=True, text=True,
                          timeout=300, check=True)
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def test_profiled_run_has_no_profiler_memory_finding_and_shows_the_profile(
        tmp_path: Path) -> None:
    run = tmp_path / "prof"
    proc = stepscope_run(run, *python_script("torch_plain.py", "--steps", "40"),
                         args=("--profile-steps", "10:13"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    d = _json("diagnose", str(run))
    memory = [f for f in d["findings"] if f["category"] == "memory"
              and f["severity"] != "info"]
    assert memory == [], memory
    assert d["bottleneck"] not in ("memory", "stall")
    html_path = Path(_json("report", str(run))["html"])
    ops = embedded(html_path)["run"]["profile"]["report"]["top_ops"]
    assert any(o["name"].startswith("aten::") for o in ops)  # the capture's ops, by name
    with offline_page(html_path, "report-profile") as page:
        shown = page.inner_text("#profile")
        assert "Top ops" in shown and "aten::" in shown
        assert "steps 10:13" in page.inner_text("#profile-window")


def test_the_capture_shows_the_phases_the_records_measured(tmp_path: Path) -> None:
    run = tmp_path / "phases"
    proc = stepscope_run(run, *python_script("torch_plain.py", "--steps", "20"),
                         args=("--profile-steps", "10:13"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    capture = RunDir(run).profile_dirs()[-1]
    rank = _json("trace", str(capture))["ranks"]["0"]
    traced = rank["phase_means_us"]
    assert all(traced[p] > 0 for p in ("forward", "backward", "optimizer")), traced
    table, _ = RunDir(run).read_steps()
    inside = table.select((table["step"] >= 10) & (table["step"] < 13))
    # The marks bracket exactly what the hooks time: forward and backward agree within
    # 10% (the bar). The trace's optimizer also counts zero_grad, which the
    # records leave outside the optimizer phase: it can only be larger.
    for phase in ("forward", "backward"):
        recorded = float(np.mean(inside[f"{phase}_s"])) * 1e6
        assert abs(traced[phase] / recorded - 1) <= 0.10, (phase, traced, recorded)
    assert traced["optimizer"] >= 0.9 * float(np.mean(inside["optimizer_s"])) * 1e6
