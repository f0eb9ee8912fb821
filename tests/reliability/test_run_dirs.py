"""Run directories are never overwritten; a full disk loses records but says so.

Once, a second `stepscope run --out DIR` replaced the first run.json and
merged both runs' rows; on a full disk `stepscope run` exited 2 although training exited
0, run.json stayed `running`, the loss was never written and temporary files were left.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from support.procs import no_traceback, script, stepscope

pytestmark = pytest.mark.slow
PLAIN = Path(__file__).resolve().parents[1] / "scripts" / "torch_plain.py"
SMALL = ("--batch", "2", "--seq", "8")
STEPS = 200


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def test_second_run_into_the_same_out_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = stepscope("run", "--out", str(out), "--", sys.executable, str(PLAIN),
                      "--steps", "4", *SMALL)
    assert first.returncode == 0, first.stderr
    before = _tree(out)
    again = stepscope("run", "--out", str(out), "--", sys.executable, str(PLAIN),
                      "--steps", "6", *SMALL)
    assert again.returncode == 2
    no_traceback(again)
    assert "already holds a run" in again.stderr and "STEP" not in again.stdout
    assert _tree(out) == before  # byte-identical: run.json and every step file


def test_help_says_that_an_existing_run_is_refused() -> None:
    proc = stepscope("run", "--help")
    assert "already holds a run is refused" in " ".join(proc.stdout.split())


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 32 KiB tmpfs (as root); else a run root whose steps/ cannot be written."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() == 0:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32k", "tmpfs",
                                  str(mnt)], capture_output=True, timeout=30)
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
        try:
            yield mnt / "run"
        finally:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)
        return
    steps = mnt / "run" / "steps"
    steps.mkdir(parents=True)
    steps.chmod(0o555)  # not root: permissions hold, every step write fails
    try:
        yield mnt / "run"
    finally:
        steps.chmod(0o755)


def test_full_disk_run_finishes_and_reports_the_loss(full_disk: Path) -> None:
    run = full_disk
    # A Linear(8, 8) loop: 200 steps take seconds even on a loaded machine.
    proc = stepscope("run", "--out", str(run), "--",
                     *script("torch_signals.py", "--max-steps", str(STEPS), "--exit-code", "0"),
                     timeout=300)
    no_traceback(proc)
    assert proc.returncode == 0, proc.stderr  # training exited 0
    assert "STOPPED CLEANLY" in proc.stdout  # and was not disturbed
    meta = orjson.loads((run / "run.json").read_bytes())
    assert meta["status"] == "finished"
    dropped = meta["config"]["records_dropped"]
    assert dropped > 0 and "write error" in meta["config"]["degraded"]
    assert not [p.name for p in run.rglob("*") if p.name.endswith(".tmp")]
    kept = sum(len(p.read_bytes().splitlines()) for p in (run / "steps").glob("*.jsonl"))
    assert kept + dropped >= STEPS  # every step is either on disk or counted as lost
    for cmd in (("report", "--no-html"), ("diagnose",)):
        out = stepscope(*cmd[:1], str(run), *cmd[1:])
        no_traceback(out)
        text = " ".join((out.stdout + out.stderr).split())
        assert f"{dropped} records lost to a write error" in text, text
        assert "stalled" not in text and "no step recorded" not in text
