"""Signals sent to `stepscope run` reach the training script; nothing is orphaned.

Once, SIGINT to stepscope alone used to leave training running for 30 s
and then SIGKILL it (rc 137); SIGTERM killed stepscope (rc 143) and orphaned the child.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import orjson
import pytest

from support.procs import STEPSCOPE, TORCHRUN, Live, alive, script

pytestmark = pytest.mark.slow


def _start(out: Path, *script_args: str, run_args: tuple[str, ...] = ()) -> Live:
    return Live([STEPSCOPE, "run", "--out", str(out), *run_args, "--",
                 *script("torch_signals.py", *script_args)])


def _pid(live: Live, tag: str) -> int:
    for line in live.out:
        if line.startswith(f"{tag} "):
            return int(line.split()[1])
    raise AssertionError(f"no {tag} line in {live.stdout}")


@pytest.mark.parametrize(("sig", "handle"), [(signal.SIGTERM, "term"),
                                             (signal.SIGINT, "int")])
def test_signal_to_stepscope_reaches_script_which_stops_cleanly(tmp_path: Path, sig: int,
                                                                handle: str) -> None:
    live = _start(tmp_path / "run", "--handle", handle, "--exit-code", "3", "--child")
    live.wait_for("READY")
    script_pid, helper_pid = _pid(live, "PID"), _pid(live, "HELPER")
    os.kill(live.proc.pid, sig)  # stepscope's pid only, as `kill` or a runtime would
    rc = live.wait(timeout=60)
    assert "STOPPED CLEANLY" in live.stdout, live.stderr
    assert rc == 3, live.stderr  # the script's own exit status
    assert not alive(script_pid) and not alive(helper_pid)
    meta = orjson.loads((tmp_path / "run" / "run.json").read_bytes())
    assert meta["status"] == "failed" and meta["error"] == "exit code 3"


def test_script_killed_by_sigterm_gives_its_signal_status(tmp_path: Path) -> None:
    live = _start(tmp_path / "run", "--handle", "none")
    live.wait_for("READY")
    os.kill(live.proc.pid, signal.SIGTERM)
    assert live.wait(timeout=60) == 128 + signal.SIGTERM
    assert not alive(_pid(live, "PID"))
    steps = (tmp_path / "run" / "steps" / "rank-00000.jsonl").read_bytes().splitlines()
    assert len(steps) >= 3  # the records up to the signal were kept


def test_script_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    live = _start(tmp_path / "run", "--handle", "ignore", "--max-steps", "100000",
                  run_args=("--grace-s", "1"))
    live.wait_for("READY")
    pid = _pid(live, "PID")
    os.kill(live.proc.pid, signal.SIGTERM)
    assert live.wait(timeout=60) == 128 + signal.SIGKILL
    assert "killing it" in live.stderr and not alive(pid)


def test_sigusr1_is_forwarded_without_ending_the_wait(tmp_path: Path) -> None:
    live = _start(tmp_path / "run", "--handle", "term")
    live.wait_for("READY")
    os.kill(live.proc.pid, signal.SIGUSR1)  # the script has no handler: it dies of it
    assert live.wait(timeout=60) == 128 + signal.SIGUSR1
    assert not alive(_pid(live, "PID"))


def test_sigterm_to_stepscope_ends_torchrun_and_every_worker(tmp_path: Path) -> None:
    live = Live([STEPSCOPE, "run", "--out", str(tmp_path / "run"), "--", TORCHRUN,
                 "--standalone", "--nproc-per-node", "2",
                 *script("torch_signals.py", "--handle", "none")[1:]])
    live.wait_for("READY", count=2, timeout=120)
    pids = [int(line.split()[-1]) for line in live.stdout.splitlines() if "PID " in line]
    assert len(pids) == 2
    os.kill(live.proc.pid, signal.SIGTERM)
    rc = live.wait(timeout=90)
    assert rc != 0 and not any(alive(p) for p in pids), live.stderr
    meta = orjson.loads((tmp_path / "run" / "run.json").read_bytes())
    assert meta["status"] == "failed"


def test_worker_blocked_in_a_collective_dies_of_sigterm_with_its_records(tmp_path: Path
                                                                        ) -> None:
    out = tmp_path / "run"
    live = Live([STEPSCOPE, "run", "--out", str(out), "--grace-s", "5", "--", TORCHRUN,
                 "--standalone", "--nproc-per-node", "2",
                 *script("torch_blocked.py", "--steps", "5")[1:]])
    try:
        live.wait_for("BLOCKED", timeout=120)
        pid = _pid(live, "BLOCKED")
        time.sleep(0.5)  # let it enter the barrier (a C++ wait, not the interpreter)
        os.kill(pid, signal.SIGTERM)
        end = time.monotonic() + 30
        while alive(pid) and time.monotonic() < end:
            time.sleep(0.1)
        assert not alive(pid), "a worker blocked in gloo ignored SIGTERM"
        rows = [orjson.loads(x) for x in
                (out / "steps" / "rank-00001.jsonl").read_bytes().splitlines()]
        assert sorted(r["step"] for r in rows if "step_time_s" in r) == list(range(5))
    finally:
        os.kill(live.proc.pid, signal.SIGTERM)
        live.wait(timeout=90)
