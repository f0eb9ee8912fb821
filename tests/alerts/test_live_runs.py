"""Real runs with live alerts: `stepscope run --alerts` on plain PyTorch scripts, the stall
watchdog on a hang, `stepscope watch` on a frozen and then a killed trainer, and training
that a slow or dead endpoint does not hold up."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import stepscope
from stepscope.alerts import AlertConfigError
from stepscope.rundir.store import RunDir
from support.chat_robots import DING_SECRET, DING_TOKEN, ChatRobots

SCRIPTS = Path(__file__).resolve().parent / "scripts"
pytestmark = pytest.mark.slow


def _alert_file(tmp_path: Path, robots: ChatRobots | None, rules: str = "",
                url: str | None = None) -> Path:
    target = url or (robots.url("webhook") if robots else "")
    sink = f'[[sink]]\ntype = "webhook"\nurl = "{target}"\nmin_severity = "info"\n' \
        if target else ""
    p = tmp_path / "alerts.toml"
    p.write_text(f"[rules]\n{rules}\n{sink}")
    return p


def _stepscope(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE_")}
    return subprocess.run([sys.executable, "-m", "stepscope", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def _alerts(run: Path) -> list[dict[str, Any]]:
    events, _ = RunDir.open(run).read_events(type="alert")
    return events


def test_step_time_tripling_from_step_n_fires_within_m_steps(
        tmp_path: Path, robots: ChatRobots, monkeypatch: pytest.MonkeyPatch) -> None:
    f = _alert_file(tmp_path, robots, "consecutive = 3\nstall_after_s = 600")
    # A signed DingTalk robot too, its URL and secret from the environment.
    with f.open("a") as fh:
        fh.write('[[sink]]\ntype = "dingtalk"\nurl_env = "T_DING_URL"\n'
                 'secret_env = "T_DING_SECRET"\nkeyword = "stepscope"\n')
    monkeypatch.setenv("T_DING_URL", robots.url("dingtalk"))
    monkeypatch.setenv("T_DING_SECRET", DING_SECRET)
    out = tmp_path / "run"
    proc = _stepscope("run", "--alerts", str(f), "--out", str(out), "--", sys.executable,
                      str(SCRIPTS / "step_time_triples.py"), "--steps", "45",
                      "--slow-from", "30")
    assert proc.returncode == 0, proc.stderr
    assert [r.platform for r in robots.state.accepted].count("dingtalk") >= 1
    assert robots.state.refused == []
    for path in out.rglob("*"):  # secrets never reach the run directory or the logs
        if path.is_file():
            data = path.read_bytes()
            assert DING_SECRET.encode() not in data and DING_TOKEN.encode() not in data
    assert DING_SECRET not in proc.stdout + proc.stderr
    step_time = [a for a in _alerts(out) if a["rule"] == "step_time"]
    assert len(step_time) == 1
    # Steps are recorded at the optimizer step: slow step 30 is the 31st row (index 30).
    assert 30 <= step_time[0]["step"] <= 30 + 3
    assert step_time[0]["delivery"]["webhook#1"].startswith("accepted")
    # Chosen by the rule, not the text: another rule's numbers can name step_time_s (a data
    # wait or a contended host alert, which a loaded CI host may rightly raise).
    [received] = [a for r in robots.state.accepted if r.platform == "webhook"
                  for a in r.body["alerts"] if a["rule"] == "step_time"]
    assert received["values"]["step_time_s"] > 2.5 * received["values"]["median_s"]


def test_healthy_run_fires_nothing(tmp_path: Path, robots: ChatRobots) -> None:
    f = _alert_file(tmp_path, robots)
    out = tmp_path / "run"
    proc = _stepscope("run", "--alerts", str(f), "--out", str(out), "--", sys.executable,
                      str(SCRIPTS / "step_time_triples.py"), "--steps", "60",
                      "--slow-from", "1000")
    assert proc.returncode == 0, proc.stderr
    assert _alerts(out) == [] and robots.state.accepted == []


def test_hang_in_a_step_fires_the_watchdog_with_the_blocking_call(tmp_path: Path,
                                                                  robots: ChatRobots) -> None:
    f = _alert_file(tmp_path, robots, "stall_after_s = 2")
    out = tmp_path / "run"
    proc = _stepscope("run", "--alerts", str(f), "--out", str(out), "--", sys.executable,
                      str(SCRIPTS / "hang_in_step.py"), "--hang-at", "8", "--hang-s", "8")
    assert proc.returncode == 0, proc.stderr
    [stall] = [a for a in _alerts(out) if a["rule"] == "stall"]
    assert "read_from_stalled_storage" in stall["detail"] and "time.sleep" in stall["detail"]
    assert "the training thread is in read_from_stalled_storage" in stall["message"]
    assert 2.0 <= stall["values"]["stalled_s"] <= 2.0 + 5.0
    assert stall["delivery"]["webhook#1"].startswith("accepted")
    assert any("read_from_stalled_storage" in r.body["text"] for r in robots.state.accepted)


def test_bad_alert_file_stops_run_before_the_command_starts(tmp_path: Path) -> None:
    f = tmp_path / "alerts.toml"
    f.write_text("[rules]\nconsecutiv = 3\n")
    marker = tmp_path / "started"
    proc = _stepscope("run", "--alerts", str(f), "--out", str(tmp_path / "run"), "--",
                      sys.executable, "-c", f"open({str(marker)!r}, 'w')")
    assert proc.returncode == 2 and not marker.exists()
    assert proc.stderr.count("\n") == 1 and "'consecutiv'" in proc.stderr
    with pytest.raises(AlertConfigError, match="'consecutiv'"):
        stepscope.Recorder(tmp_path / "r2", alerts=f)


@pytest.mark.parametrize("mode", ["slow", "absent"])
def test_slow_or_dead_endpoint_changes_nothing_for_training(tmp_path: Path,
                                                            robots: ChatRobots,
                                                            mode: str) -> None:
    robots.state.mode, robots.state.delay_s = "slow", 10.0
    if mode == "absent":
        robots.stop()
    # Fires on nearly every step: the sender is always busy with the bad endpoint.
    f = _alert_file(tmp_path, robots, "step_time_factor = 1.01\nconsecutive = 1\n"
                    "warmup_steps = 0\ncooldown_s = 0\nstall_after_s = 600")
    rec = stepscope.Recorder(tmp_path / "run", alerts=f, flush_interval_s=0.05)
    for i in range(200):
        with rec.step(tokens=100):
            pass
        if i % 20 == 0:
            rec.flush()
    rec.close()
    table, _ = RunDir.open(tmp_path / "run").read_steps()
    assert len(table) == 200
    assert _alerts(tmp_path / "run")  # the alerts were raised and their fate recorded


def _lines(stream: Any) -> queue.Queue[str]:
    q: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in stream:
            q.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return q


def _wait_for(q: queue.Queue[str], rule: str, timeout: float) -> dict[str, Any]:
    while True:
        doc = json.loads(q.get(timeout=timeout))
        if doc["rule"] == rule:
            return doc


def test_watch_reports_a_stopped_then_a_killed_trainer(tmp_path: Path) -> None:
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE_")}
    trainer = subprocess.Popen([sys.executable, str(SCRIPTS / "recorder_forever.py"),
                                str(run)], stdout=subprocess.PIPE, text=True, env=env)
    watch = None
    try:
        assert trainer.stdout is not None and trainer.stdout.readline().strip() == "steps"
        watch = subprocess.Popen([sys.executable, "-m", "stepscope", "watch", str(run),
                                  "--stall-after", "2", "--poll", "0.2", "--json"],
                                 stdout=subprocess.PIPE, text=True, env=env)
        assert watch.stdout is not None
        lines = _lines(watch.stdout)
        os.kill(trainer.pid, signal.SIGSTOP)
        frozen = _wait_for(lines, "frozen", timeout=30)
        assert str(trainer.pid) in frozen["message"] and "stopped" in frozen["message"]
        assert frozen["values"]["idle_s"] <= 2 * 2.0
        if shutil.which("py-spy", path=env.get("PATH")):  # the frozen process's own stack
            assert "recorder_forever.py" in frozen["detail"]
        os.kill(trainer.pid, signal.SIGKILL)
        gone = _wait_for(lines, "process_gone", timeout=30)
        assert str(trainer.pid) in gone["message"]
        assert watch.wait(timeout=30) == 1
        observed = [a["rule"] for a in _alerts(run) if a.get("observer") == "watch"]
        assert observed == ["frozen", "process_gone"]
    finally:
        for p in (trainer, watch):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=10)
