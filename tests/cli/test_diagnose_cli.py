"""`stepscope diagnose` and `stepscope isolate` on run directories written by
stepscope.Recorder with an injected clock (exact times), and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stepscope import Recorder, RunDir
from stepscope.analysis.isolation import data_isolation_verdict


def _stepscope(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stepscope", *args], capture_output=True,
                          text=True, timeout=120, check=False)


class Clock:
    """Monotonic seconds advanced by hand."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _record(path: Path, n: int = 60, data_s: float = 0.0, stall_at: int | None = None,
            loss: bool = True) -> None:
    clock = Clock()
    rec = Recorder(path, meta={"baseline": {"lr": 1e-3}}, clock=clock,
                   wall_clock=lambda: 1e9 + clock.t, background=False)
    for i in range(n):
        rec.add_time("data_wait", data_s)
        clock.t += data_s
        if i == stall_at:
            clock.t += 30.0  # nothing happens for 30 s (e.g. a data retry loop)
        with rec.step(tokens=1000, samples=4) as s:
            with s.phase("forward"):
                clock.t += 0.04 if i else 0.9
            with s.phase("backward"):
                clock.t += 0.05
            if loss:
                s.log(loss=3.0 - i / n, lr=1e-3)
    rec.close()


def test_diagnose_json_names_stall_and_data_wait(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _record(run, data_s=0.03, stall_at=40)
    proc = _stepscope("diagnose", str(run), "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["bottleneck"] == "stall"  # 30 s of a 37 s run: the largest cost
    got = {(f["category"], f["severity"], tuple(f["steps"]) if f["steps"] else None)
           for f in d["findings"]}
    assert ("stall", "warning", (39, 40)) in got
    assert ("data_pipeline", "warning", (1, 59)) in got
    # steady steps: 30 ms of 120 ms each = 25% waiting for data (the 30 s stall step aside)
    (wait,) = [f for f in d["findings"] if f["category"] == "data_pipeline"]
    assert wait["evidence"]["median_data_wait_s"] == 0.03


def test_diagnose_terminal_output_and_healthy_run(tmp_path: Path) -> None:
    run = tmp_path / "ok"
    _record(run)
    proc = _stepscope("diagnose", str(run))
    assert proc.returncode == 0, proc.stderr
    assert "bottleneck: none found" in proc.stdout
    assert "[warning]" not in proc.stdout and "[critical]" not in proc.stdout


def test_no_loss_recorded_says_metrics_do_not_reach_stepscope(tmp_path: Path) -> None:
    run = tmp_path / "noloss"
    _record(run, loss=False)
    d = json.loads(_stepscope("diagnose", str(run), "--json").stdout)
    (f,) = [f for f in d["findings"] if f["severity"] == "warning"]
    assert f["category"] == "logging"
    assert f["message"].startswith("metrics are not reaching stepscope")


def test_isolation_event_is_shown_by_diagnose(tmp_path: Path) -> None:
    base, replay = tmp_path / "base", tmp_path / "replay"
    _record(base, data_s=0.03)
    _record(replay)
    res = data_isolation_verdict(RunDir.open(base).read_steps()[0],
                                 RunDir.open(replay).read_steps()[0])
    RunDir.open(base).append_event({"type": "isolation", "kind": "data",
                                    "result": res.to_dict()})
    d = json.loads(_stepscope("diagnose", str(base), "--json").stdout)
    (iso,) = [f for f in d["findings"] if f["rule"] == "isolation.data"]
    assert iso["evidence"]["isolation"]["verdict"] == "bottleneck"
    # 0.03 s of data wait out of 0.12 s steps, recovered by the replay: 25% of the time
    assert abs(iso["evidence"]["isolation"]["share"] - 0.25) < 1e-9


def test_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    for args in (("diagnose", str(tmp_path / "missing")),
                 ("diagnose", str(tmp_path), "--json")):
        proc = _stepscope(*args)
        assert proc.returncode == 2
        assert proc.stderr.startswith("stepscope: error:") and proc.stderr.count("\n") == 1
    run = tmp_path / "r"
    _record(run, n=5)
    proc = _stepscope("diagnose", str(run), "--trace", str(tmp_path / "nope"))
    assert proc.returncode == 2 and "--trace" in proc.stderr
    proc = _stepscope("isolate", "data", "--steps", "2", "--out", str(tmp_path / "iso"), "--",
                      sys.executable, "-c", "print('no training here')")
    assert proc.returncode == 2 and "no step records" in proc.stderr
