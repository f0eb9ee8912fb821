"""Records lost to a full disk are counted and reported as soon as space returns.

The full-disk case in process: a real small tmpfs filled by another file, then freed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepscope.record.recorder import Recorder
from stepscope.rundir.store import RunDir
from support.disk import small_tmpfs


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path, "64k") as mnt:
        yield mnt


def _fill(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:  # ENOSPC: the disk is full now
        pass
    finally:
        os.close(fd)


def test_loss_is_reported_when_space_returns_and_at_close(small_fs: Path) -> None:
    t = [0.0]
    rec = Recorder(small_fs / "run", {"run_id": "run"}, rank=0, clock=lambda: t[0],
                   background=False, no_usage=True)
    filler = small_fs / "filler"
    _fill(filler)
    for _ in range(5):
        rec.start_step()
        t[0] += 0.1
        rec.end_step()
    with pytest.warns(RuntimeWarning, match="records are being dropped"):
        rec.flush()  # the disk is full: 5 records dropped, training goes on
    filler.unlink()
    rec.start_step()
    t[0] += 0.1
    rec.end_step()
    rec.flush()  # space is back: written, and the loss so far is recorded now
    run = RunDir(small_fs / "run")
    losses, _ = run.read_events(type="write_error")
    assert [(e["rank"], e["records_dropped"]) for e in losses] == [(0, 5)]
    assert "No space left" in losses[0]["first_error"]
    rec.close()
    meta = run.read_meta()
    assert meta.status == "finished" and meta.config["records_dropped"] == 5
    assert "5 step records lost to a write error" in meta.config["degraded"]
    table, _ = run.read_steps()
    assert table["step"].tolist() == [5]
