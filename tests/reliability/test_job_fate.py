"""`stepscope run` never changes how the job ends: its own code and its signals decide.

Before: a script that ended a forked worker with SIGTERM (a DataLoader shutting down busy
workers, an ``os.fork`` helper) exited 143 and was recorded ``failed`` (the SIGTERM
finaliser's wakeup pipe was inherited: the child's signal woke the trainer's watcher); a
SIGTERM handler installed after the first step was overridden (its checkpoint cut off);
``nohup stepscope run`` died of a hang-up it was told to ignore; helpers the script
detached on purpose were killed 5 s after it exited. Each script exits 0 when run plain.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import orjson
import pytest

from support.procs import STEPSCOPE, Live, alive, script

pytestmark = pytest.mark.slow


def _start(out: Path, *args: str, prefix: tuple[str, ...] = ()) -> Live:
    return Live([*prefix, STEPSCOPE, "run", "--out", str(out), "--no-html", "--",
                 *script("torch_fate.py", *args)])


def _pid(live: Live, tag: str) -> int:
    for line in live.out:
        if line.startswith(f"{tag} "):
            return int(line.split()[1])
    raise AssertionError(f"no {tag} line in {live.stdout}")


def _finished(out: Path, steps: int) -> None:
    meta = orjson.loads((out / "run.json").read_bytes())
    assert meta["status"] == "finished", meta
    rows = [orjson.loads(x) for x in (out / "steps" / "rank-00000.jsonl").read_bytes()
            .splitlines()]
    assert len([r for r in rows if "step" in r]) == steps


@pytest.mark.parametrize(("mode", "marker", "steps"), [
    ("dataloader", "WORKERS ENDED", 15),  # 1 step, 2 DataLoader batches, then 12 steps
    ("fork", "HELPER ENDED -15", 14),  # the helper itself died of its SIGTERM
    ("mp-process", "HELPER ENDED -15", 14),
])
def test_a_sigterm_to_a_forked_child_never_reaches_the_trainer(tmp_path: Path, mode: str,
                                                               marker: str, steps: int
                                                               ) -> None:
    out = tmp_path / "run"
    live = _start(out, "--mode", mode)
    rc = live.wait(timeout=120)
    assert rc == 0, live.stdout + live.stderr
    assert marker in live.stdout and f"TRAINED {steps}" in live.stdout
    _finished(out, steps)


def test_mindspore_training_survives_a_sigterm_to_a_forked_helper(tmp_path: Path) -> None:
    pytest.importorskip("mindspore")
    out = tmp_path / "run"
    live = Live([STEPSCOPE, "run", "--out", str(out), "--no-html", "--",
                 *script("ms_fate.py")])
    rc = live.wait(timeout=240)
    assert rc == 0, live.stdout + live.stderr
    assert "HELPER ENDED -15" in live.stdout and "TRAINED 12" in live.stdout
    meta = orjson.loads((out / "run.json").read_bytes())
    assert meta["status"] == "finished", meta


def test_a_sigterm_handler_set_after_the_first_step_is_honoured(tmp_path: Path) -> None:
    out, ckpt = tmp_path / "run", tmp_path / "ckpt.bin"
    live = _start(out, "--mode", "late-handler", "--steps", "100000",
                  "--checkpoint", str(ckpt))
    live.wait_for("READY", timeout=120)
    os.kill(_pid(live, "PID"), signal.SIGTERM)  # to the script, as a scheduler does
    rc = live.wait(timeout=60)
    assert rc == 0, live.stdout + live.stderr
    assert "CHECKPOINT SAVED" in live.stdout
    assert ckpt.stat().st_size == 10 * 1024  # written whole, not cut off
    meta = orjson.loads((out / "run.json").read_bytes())
    assert meta["status"] == "finished", meta


def test_nohup_keeps_sighup_ignored_and_does_not_forward_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    live = _start(out, "--mode", "hangup", "--steps", "60", prefix=("nohup",))
    live.wait_for("READY", timeout=120)
    os.kill(live.proc.pid, signal.SIGHUP)  # the terminal hangs up: stepscope's group
    rc = live.wait(timeout=120)
    assert rc == 0, live.stdout + live.stderr
    assert "TRAINED 61" in live.stdout  # the first step, then all 60
    _finished(out, 61)


def test_a_helper_detached_into_its_own_session_is_left_alone(tmp_path: Path) -> None:
    out = tmp_path / "run"
    live = _start(out, "--mode", "detach")
    rc = live.wait(timeout=120)
    helper = _pid(live, "DETACHED")
    try:
        assert rc == 0, live.stdout + live.stderr
        assert alive(helper), "the detached helper was ended with the run"
        assert "outlived it" not in live.stderr
    finally:
        if alive(helper):
            os.kill(helper, signal.SIGKILL)


def test_nohup_is_on_this_machine() -> None:
    """The hang-up test runs the real `nohup` (coreutils)."""
    assert subprocess.run(["nohup", "true"], capture_output=True, timeout=30).returncode == 0
