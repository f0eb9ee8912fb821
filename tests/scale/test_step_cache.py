"""The columnar cache: appended as a rank file grows, rebuilt whenever it does not match.

Every check compares the cached read with a cold read of the JSONL (the source of truth).
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest

from stepscope import Recorder, RunDir, RunMeta
from stepscope.rundir import steps_cache as cache
from support.disk import small_tmpfs
from support.old_step_reader import assert_tables_equal


def _line(step: int, rank: int = 0) -> bytes:
    return orjson.dumps({"rank": rank, "step": step, "step_time_s": 1.0 + step % 3,
                         "tokens": 100.0 * (step + 1)}) + b"\n"


def _run(tmp_path: Path, steps: int = 50) -> RunDir:
    run = RunDir.create(tmp_path / "run", RunMeta(run_id="c"))
    run.steps_path(0).write_bytes(b"".join(_line(i) for i in range(steps)))
    return run


def _segments(run: RunDir) -> list[Path]:
    return sorted((run.cache_dir / "steps" / "rank-00000.jsonl.d").glob("*.npy"))


def _same_as_cold(run: RunDir) -> None:
    warm, ws = run.read_steps()
    cold, cs = run.read_steps(cache=False)
    assert_tables_equal(warm, cold)
    assert ws.to_dict() == cs.to_dict()


def test_cache_is_written_then_appended_as_the_file_grows(tmp_path: Path) -> None:
    run = _run(tmp_path)
    _same_as_cold(run)
    assert len(_segments(run)) == 1
    with open(run.steps_path(0), "ab") as f:
        f.write(b"".join(_line(i) for i in range(50, 80)))
    _same_as_cold(run)
    assert len(_segments(run)) == 2
    assert run.read_steps()[0]["step"].tolist() == list(range(80))


def test_segments_hold_only_the_columns_with_values(tmp_path: Path) -> None:
    """A known column the rows never record is neither written nor read back (a run
    page reads 14 columns, half of them never recorded); one that gains values as the
    file grows, or holds an explicit "NaN", is kept, and every read equals the cold one."""
    run = _run(tmp_path, steps=20)
    _same_as_cold(run)
    manifest = orjson.loads((run.cache_dir / "steps" / "rank-00000.jsonl.json").read_bytes())
    assert sorted(manifest["segments"][0]["columns"]) == ["rank", "step", "step_time_s",
                                                         "tokens"]
    assert np.load(_segments(run)[0]).shape == (4, 20)
    grown = [orjson.dumps({"rank": 0, "step": 20 + i, "step_time_s": 1.0, "loss": v,
                           "grad_norm": None}) + b"\n" for i, v in enumerate((2.5, "NaN", 2.4))]
    with open(run.steps_path(0), "ab") as f:
        f.write(b"".join(grown))
    _same_as_cold(run)
    manifest = orjson.loads((run.cache_dir / "steps" / "rank-00000.jsonl.json").read_bytes())
    assert sorted(manifest["segments"][1]["columns"]) == [
        "loss", "rank", "step", "step_time_s"]
    table = run.read_steps()[0]
    assert np.isnan(table["loss"][:20]).all() and table["loss"][20] == 2.5
    assert table["loss_nan"].tolist() == [0.0] * 21 + [1.0, 0.0]
    assert not table.has_data("grad_norm") and table["grad_norm"].strides == (0,)


def test_truncated_or_rewritten_file_rebuilds_the_cache(tmp_path: Path) -> None:
    run = _run(tmp_path)
    run.read_steps()
    run.steps_path(0).write_bytes(b"".join(_line(i) for i in range(20)))  # truncated
    _same_as_cold(run)
    assert run.read_steps()[0]["step"].tolist() == list(range(20))
    data = bytearray(run.steps_path(0).read_bytes())
    data[data.index(b'"tokens":100.0') + 9] = ord("9")  # same size, other bytes
    run.steps_path(0).write_bytes(bytes(data))
    st = run.steps_path(0).stat()
    os.utime(run.steps_path(0), ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    table, _ = run.read_steps()
    assert table["tokens"][0] == 900.0
    _same_as_cold(run)


def test_torn_tail_is_counted_never_cached_and_read_once_completed(tmp_path: Path) -> None:
    run = _run(tmp_path, steps=10)
    line = _line(10)
    with open(run.steps_path(0), "ab") as f:
        f.write(line[:15])
    table, stats = run.read_steps()
    assert len(table) == 10 and stats.torn_tail == 1
    _same_as_cold(run)
    with open(run.steps_path(0), "ab") as f:
        f.write(line[15:])
    table, stats = run.read_steps()
    assert table["step"].tolist() == list(range(11)) and stats.torn_tail == 0
    _same_as_cold(run)


def test_corrupt_manifest_or_segment_is_rebuilt_not_trusted(tmp_path: Path) -> None:
    run = _run(tmp_path)
    run.read_steps()
    manifest = run.cache_dir / "steps" / "rank-00000.jsonl.json"
    manifest.write_bytes(b"{ not json")
    _same_as_cold(run)
    seg = _segments(run)[0]
    seg.write_bytes(seg.read_bytes()[:100])  # truncated .npy
    _same_as_cold(run)
    d = orjson.loads(manifest.read_bytes())
    d["end"] = "12"  # wrong type
    manifest.write_bytes(orjson.dumps(d))
    _same_as_cold(run)
    np.save(_segments(run)[0], np.zeros((3, 3)))  # wrong shape
    _same_as_cold(run)


def test_many_appends_are_compacted(tmp_path: Path) -> None:
    run = _run(tmp_path, steps=1)
    for i in range(1, 40):
        with open(run.steps_path(0), "ab") as f:
            f.write(_line(i))
        run.read_steps()
    assert len(_segments(run)) <= cache._MAX_SEGMENTS
    _same_as_cold(run)
    assert run.read_steps()[0]["step"].tolist() == list(range(40))


def test_unwritable_cache_directory_still_reads(tmp_path: Path) -> None:
    run = _run(tmp_path)
    run.cache_dir.write_text("not a directory")  # every cache write fails
    _same_as_cold(run)
    assert len(run.read_steps()[0]) == 50


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path, "1m") as mnt:
        yield mnt


def test_full_disk_while_caching_leaves_no_temporary_or_orphan_file(tiny_disk: Path) -> None:
    run = RunDir.create(tiny_disk / "run", RunMeta(run_id="c"))
    run.steps_path(0).write_bytes(b"".join(_line(i) for i in range(1500)))  # ~90 KiB
    # Fill the rest but 8 KiB: the segment (a float64 per row and column, ~320 KiB) cannot
    # be written.
    free = os.statvfs(tiny_disk).f_bavail * os.statvfs(tiny_disk).f_frsize
    (tiny_disk / "filler").write_bytes(b"\0" * (free - 8192))
    _same_as_cold(run)  # the read still has its whole result
    left = sorted(p.name for p in (run.cache_dir / "steps").iterdir()) \
        if (run.cache_dir / "steps").exists() else []
    assert left == [], left  # no .tmp, no segment that no manifest names
    (tiny_disk / "filler").unlink()  # space returns: the cache is written as usual
    _same_as_cold(run)
    assert len(_segments(run)) == 1


def _writer(path: str, steps: int) -> None:
    rec = Recorder(path, rank=0, flush_interval_s=0.001)
    for i in range(steps):
        with rec.step(tokens=10, samples=1) as s:
            s.log(loss=float(i))
        if i % 50 == 0:
            rec.flush()
    rec.close()


def test_a_reader_while_the_run_writes_sees_a_consistent_prefix(tmp_path: Path) -> None:
    path = tmp_path / "run"
    RunDir.create(path, RunMeta(run_id="live"))
    proc = mp.get_context("spawn").Process(target=_writer, args=(str(path), 3000))
    proc.start()
    run = RunDir(path)
    seen = []
    try:
        while proc.is_alive() or not seen:
            table, stats = run.read_steps()
            steps = table["step"].tolist()
            assert steps == list(range(len(steps)))  # a prefix, in order, nothing lost
            assert stats.skipped == stats.torn_tail
            assert np.array_equal(table["loss"], np.arange(len(steps), dtype=float))
            seen.append(len(steps))
    finally:
        proc.join(120)
    assert proc.exitcode == 0
    assert run.read_steps()[0]["step"].tolist() == list(range(3000))
    _same_as_cold(run)
    assert seen == sorted(seen)


def test_segments_of_the_format_before_per_file_directories_are_removed(tmp_path: Path
                                                                       ) -> None:
    """An upgrade rebuilds a cache of format 1 (segments beside the manifests) and removes
    the segments its manifest named; a name of another form is kept, whatever it says."""
    run = _run(tmp_path)
    steps = run.cache_dir / "steps"
    steps.mkdir(parents=True)
    old = [steps / "rank-00000.jsonl.0123456789ab.npy",
           steps / "rank-00000.jsonl.0123456789ab.nan.npy"]
    other = steps / "keep-me.npy"
    for p in [*old, other]:
        np.save(p, np.zeros((2, 2)))
    (steps / "rank-00000.jsonl.json").write_bytes(orjson.dumps({
        "format": "stepscope-steps-1:000000000000",
        "segments": [{"file": old[0].name, "flags": old[1].name},
                     {"file": other.name, "flags": "../run.json"}]}))
    _same_as_cold(run)
    assert [p.exists() for p in old] == [False, False]
    assert other.exists() and run.meta_path.exists()
    assert len(_segments(run)) == 1
    assert sorted(p.name for p in steps.iterdir()) == [
        "keep-me.npy", "rank-00000.jsonl.d", "rank-00000.jsonl.json"]
