"""Alerts outlive their process: recorded as pending before sending, delivered later by
`stepscope alerts flush`, by the `stepscope run` launcher, or after a bounded close."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from stepscope import RunMeta
from stepscope.alerts.pending import FlushNotRun, find_pending, flush_pending
from stepscope.rundir.store import RunDir
from support.chat_robots import BlackHole, ChatRobots

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE_")}


def _stepscope(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stepscope", *args], capture_output=True,
                          text=True, timeout=timeout, env=_env())


def _alert_file(path: Path, url: str, timeout_s: float = 2.0) -> Path:
    # The same sink name in every file: a flush finds the sink by the name it was recorded with.
    path.write_text(f'[rules]\nstall_after_s = 600\n[[sink]]\ntype = "webhook"\n'
                    f'name = "team-hook"\nurl = "{url}"\nmin_severity = "info"\n'
                    f"timeout_s = {timeout_s}\nretries = 0\n")
    return path


def _events(run: Path) -> list[dict[str, Any]]:
    events, _ = RunDir.open(run).read_events()
    return events


def _wait_pending(run: Path, proc: subprocess.Popen[str], timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        assert proc.poll() is None, "the trainer ended before its alert was raised"
        if (run / "events.jsonl").exists() and any(
                e.get("type") == "alert_pending" for e in _events(run)):
            return
        time.sleep(0.1)
    raise AssertionError("no alert_pending record in time")


def _late(robots: ChatRobots) -> list[str]:
    return [t for t in robots.state.texts("webhook") if "delivered late" in t]


def test_pending_is_what_no_record_settled_in_any_order() -> None:
    def pend(aid: str, sinks: list[str]) -> dict[str, Any]:
        return {"type": "alert_pending", "id": aid, "rule": "stall", "severity": "critical",
                "run": "r", "rank": 0, "step": 4, "message": "m", "next_step": "n",
                "source": "s", "values": {"stalled_s": 9.5}, "sinks": sinks, "pid": 12,
                "hostname": "h", "alerts_file": "/x.toml"}

    events = [
        {"type": "alert", "id": "b", "delivery": {"wecom#1": "accepted: errcode 0"}},
        pend("a", ["wecom#1", "slack#2"]), pend("b", ["wecom#1"]), pend("c", ["wecom#1"]),
        pend("d", ["wecom#1"]),
        {"type": "alert", "id": "a", "delivery": {"wecom#1": "failed after 3 attempts: 500",
                                                  "slack#2": "pending: the process ended"}},
        {"type": "alert", "id": "c", "delivery": {"all": "suppressed: same alert within"}},
    ]
    found = {p.alert.id: p for p in find_pending(events)}
    assert sorted(found) == ["a", "d"]  # b settled before its pending line, c suppressed
    assert found["a"].sinks == ("slack#2",) and found["d"].sinks == ("wecom#1",)
    assert (found["a"].pid, found["a"].hostname, found["a"].alerts_file) == (12, "h", "/x.toml")
    assert found["a"].alert.values == {"stalled_s": 9.5} and found["a"].alert.step == 4


@pytest.mark.slow
def test_close_with_a_black_hole_endpoint_does_not_wait_and_leaves_the_alert_pending(
        tmp_path: Path, robots: ChatRobots) -> None:
    hole = BlackHole()
    run = tmp_path / "run"
    try:
        # A 60 s request timeout: a close that waited for the request would take a minute.
        f = _alert_file(tmp_path / "alerts.toml", hole.url, timeout_s=60.0)
        proc = subprocess.run([sys.executable, str(SCRIPTS / "nan_loss_recorder.py"),
                               str(run), str(f), "--then", "close"], capture_output=True,
                              text=True, timeout=120, env=_env())
    finally:
        hole.stop()
    assert proc.returncode == 0, proc.stderr
    # close() returned while the sender thread was still blocked on the black hole.
    assert json.loads(proc.stdout.splitlines()[-1]) == {"sender_busy_after_close": True}
    [settled] = [e for e in _events(run) if e.get("type") == "alert"]
    assert settled["rule"] == "nonfinite_loss"
    assert settled["delivery"]["team-hook"].startswith("pending: the process ended")
    [pending] = find_pending(_events(run))
    assert pending.alert.id == settled["id"] and pending.sinks == ("team-hook",)
    assert pending.alerts_file == str(f.resolve())

    # The endpoint is back (the robot server): `stepscope alerts flush` delivers it once.
    back = _alert_file(tmp_path / "back.toml", robots.url("webhook"))
    first = _stepscope("alerts", "flush", str(run), "--alerts", str(back), "--json")
    assert first.returncode == 0, first.stderr
    [result] = json.loads(first.stdout)["results"]
    assert (result["rule"], result["sink"]) == ("nonfinite_loss", "team-hook")
    assert result["outcome"].startswith("accepted")
    [text] = _late(robots)
    assert "nonfinite_loss" in text and "loss is nan" in text
    assert find_pending(_events(run)) == []
    again = _stepscope("alerts", "flush", str(run), "--alerts", str(back))
    assert again.returncode == 0 and "no pending alerts" in again.stdout
    assert len(_late(robots)) == 1


@pytest.mark.slow
def test_sigkilled_trainer_alert_is_delivered_by_alerts_flush(tmp_path: Path,
                                                              robots: ChatRobots) -> None:
    run = tmp_path / "run"
    hole = BlackHole()  # the robot is unreachable while the trainer runs ...
    f = _alert_file(tmp_path / "alerts.toml", hole.url, timeout_s=60.0)
    trainer = subprocess.Popen([sys.executable, str(SCRIPTS / "nan_loss_recorder.py"),
                                str(run), str(f), "--then", "forever"], text=True, env=_env())
    try:
        _wait_pending(run, trainer)
        early = _stepscope("alerts", "flush", str(run))  # its process is alive: left to it
        assert early.returncode == 1 and "still running" in early.stdout
        os.kill(trainer.pid, signal.SIGKILL)
        assert trainer.wait(timeout=30) == -signal.SIGKILL
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait(timeout=10)
        hole.stop()
    assert [e for e in _events(run) if e.get("type") == "alert"] == []  # nothing settled
    _alert_file(f, robots.url("webhook"))  # ... and reachable again, same file, same name
    proc = _stepscope("alerts", "flush", str(run))  # the file the pending record names
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "nonfinite_loss" in proc.stdout and "-> team-hook: accepted" in proc.stdout
    assert len(_late(robots)) == 1 and find_pending(_events(run)) == []


@pytest.mark.slow
def test_stepscope_run_delivers_what_its_sigkilled_trainer_left_pending(
        tmp_path: Path, robots: ChatRobots) -> None:
    # The robot answers after 20 s: the trainer's request is in flight when it is killed.
    robots.state.mode, robots.state.delay_s = "slow", 20.0
    f = _alert_file(tmp_path / "alerts.toml", robots.url("webhook"), timeout_s=30.0)
    out = tmp_path / "run"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "stepscope", "run", "--alerts", str(f), "--out", str(out),
         "--", sys.executable, str(SCRIPTS / "nan_loss_torch.py")],
        stderr=subprocess.PIPE, text=True, env=_env())
    try:
        _wait_pending(out, launcher, timeout_s=120)
        [proc_ev] = [e for e in _events(out) if e.get("type") == "process"]
        robots.state.mode = "ok"  # answers at once from now on
        os.kill(proc_ev["pid"], signal.SIGKILL)  # the trainer, not the launcher
        _, err = launcher.communicate(timeout=90)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(timeout=10)
    assert launcher.returncode == 128 + signal.SIGKILL, err
    assert "pending alert nonfinite_loss -> team-hook: accepted" in err
    assert len(_late(robots)) == 1
    assert find_pending(_events(out)) == []


@pytest.mark.slow
def test_watch_delivers_what_a_sigkilled_trainer_left_pending(tmp_path: Path,
                                                              robots: ChatRobots) -> None:
    run = tmp_path / "run"
    hole = BlackHole()
    f = _alert_file(tmp_path / "alerts.toml", hole.url, timeout_s=60.0)
    back = _alert_file(tmp_path / "back.toml", robots.url("webhook"))
    trainer = subprocess.Popen([sys.executable, str(SCRIPTS / "nan_loss_recorder.py"),
                                str(run), str(f), "--then", "forever"], text=True, env=_env())
    watch = None
    try:
        _wait_pending(run, trainer)
        watch = subprocess.Popen([sys.executable, "-m", "stepscope", "watch", str(run),
                                  "--alerts", str(back), "--stall-after", "600", "--poll",
                                  "0.2", "--json"], stdout=subprocess.PIPE, text=True,
                                 env=_env())
        os.kill(trainer.pid, signal.SIGKILL)
        assert trainer.wait(timeout=30) == -signal.SIGKILL
        out, _ = watch.communicate(timeout=90)
        assert watch.returncode == 1  # the run's process is gone
    finally:
        for p in (trainer, watch):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        hole.stop()
    # The watch's own findings (it applies the same rules to the step file) ...
    assert [json.loads(x)["rule"] for x in out.splitlines()] == ["nonfinite_loss",
                                                                 "process_gone"]
    [text] = _late(robots)  # ... and the killed trainer's own alert, sent by the watch
    assert "nonfinite_loss" in text
    assert any("process_gone" in t for t in robots.state.texts("webhook"))
    assert find_pending(_events(run)) == []


def test_two_concurrent_flushes_send_each_pending_alert_once(tmp_path: Path,
                                                             robots: ChatRobots) -> None:
    # Pending records as a SIGKILLed trainer leaves them (its pid is gone: no pid at all).
    run = RunDir.create(tmp_path / "run", RunMeta(run_id="run", status="failed"))
    f = _alert_file(tmp_path / "alerts.toml", robots.url("webhook"), timeout_s=10.0)
    for aid, rule in (("a1", "nonfinite_loss"), ("a2", "stall")):
        run.append_event({"type": "alert_pending", "id": aid, "rule": rule,
                          "severity": "critical", "run": "run", "rank": 0, "step": 7,
                          "message": f"{rule} fired", "next_step": "look", "source": "test",
                          "sinks": ["team-hook"], "pid": None, "hostname": "elsewhere",
                          "alerts_file": str(f)})
    # The robot answers after 3 s: both flushes start while the first is still sending.
    robots.state.mode, robots.state.delay_s = "slow", 3.0
    cmd = [sys.executable, "-m", "stepscope", "alerts", "flush", str(run.path)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=_env()) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    sent = [a["id"] for r in robots.state.accepted for a in r.body["alerts"]]
    assert sorted(sent) == ["a1", "a2"], outs
    busy = [(p.returncode, out, err) for p, (out, err) in zip(procs, outs, strict=True)
            if "another flush" in err]
    assert len(busy) == 1, outs
    [(rc, out, err)] = busy
    assert rc == 1 and out == "" and len(err.splitlines()) == 1, err
    assert find_pending(_events(run.path)) == []


def test_a_flush_while_another_holds_the_lock_sends_nothing(tmp_path: Path,
                                                            robots: ChatRobots) -> None:
    run = RunDir.create(tmp_path / "run", RunMeta(run_id="run", status="failed"))
    f = _alert_file(tmp_path / "alerts.toml", robots.url("webhook"))
    run.append_event({"type": "alert_pending", "id": "a1", "rule": "stall",
                      "severity": "critical", "run": "run", "rank": 0, "step": 7,
                      "message": "stalled", "next_step": "look", "source": "test",
                      "sinks": ["team-hook"], "pid": None, "hostname": "elsewhere",
                      "alerts_file": str(f)})
    # The other flusher: a real process holding the lock file, as `alerts flush` does.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], "
         "os.O_RDWR | os.O_CREAT, 0o600); fcntl.flock(fd, fcntl.LOCK_EX); print('held', "
         "flush=True); time.sleep(60)", str(run.path / ".alerts-flush.lock")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(FlushNotRun, match="another flush of .* nothing sent"):
            flush_pending(run)
    finally:
        holder.kill()
        holder.wait(timeout=10)
    assert robots.state.accepted == [] and len(find_pending(_events(run.path))) == 1
    [result] = flush_pending(run)  # the lock is free again: delivered once
    assert result.outcome.startswith("accepted")
