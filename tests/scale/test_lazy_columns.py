"""A wholly cached run's table reads each column from the cache segments when first used:
the same table as the eager read of the JSONL (columns, their order, values, NaN flags),
and still readable when another reader rebuilds the cache underneath it."""

from __future__ import annotations

import gc
import shutil
from pathlib import Path

import numpy as np
import orjson
import pytest

from stepscope import RunDir, RunMeta
from stepscope.rundir.steps_lazy import _Deferred
from stepscope.schema import _is_never_recorded
from support.old_step_reader import assert_tables_equal


def _run(tmp_path: Path, ranks: int = 3, steps: int = 40) -> RunDir:
    run = RunDir.create(tmp_path / "run", RunMeta(run_id="lazy"))
    for r in range(ranks):
        lines = []
        for i in range(steps):
            rec = {"rank": r, "step": i, "step_time_s": 1.0 + (i % 5) / 10,
                   "tokens": 100.0, "loss": "NaN" if (r, i) == (1, 7) else 3.0 - i / steps,
                   "my_metric": float(i * r)}
            if r == 2:
                rec["extra_on_two"] = 1.5
            lines.append(orjson.dumps(rec))
        run.steps_path(r).write_bytes(b"\n".join(lines) + b"\n")
    return run


def test_cached_table_is_deferred_and_equals_the_cold_read(tmp_path: Path) -> None:
    run = _run(tmp_path)
    cold, cold_stats = run.read_steps(cache=False)
    run.read_steps()  # builds the cache
    warm, warm_stats = run.read_steps()
    assert isinstance(warm._cols, _Deferred)
    assert warm.columns == cold.columns  # the same columns in the same order
    assert "forward_s" not in warm._cols._got  # not read until asked for
    assert_tables_equal(warm, cold)
    assert warm_stats.to_dict() == cold_stats.to_dict()
    assert _is_never_recorded(warm["forward_s"])  # never recorded: one shared NaN
    assert warm["loss_nan"].tolist() == cold["loss_nan"].tolist()
    assert np.isnan(warm["extra_on_two"][:80]).all()  # absent from ranks 0 and 1
    sel = warm.select(warm["rank"] == 1)
    assert np.array_equal(sel["loss"], cold.select(cold["rank"] == 1)["loss"], equal_nan=True)


def test_columns_stay_readable_when_the_cache_is_rebuilt_meanwhile(tmp_path: Path) -> None:
    run = _run(tmp_path)
    cold, _ = run.read_steps(cache=False)
    run.read_steps()
    warm, _ = run.read_steps()
    shutil.rmtree(run.cache_dir)  # another reader removes (then rebuilds) the segments
    run.read_steps()
    assert_tables_equal(warm, cold)


def test_a_segment_that_does_not_match_its_manifest_is_not_used(tmp_path: Path) -> None:
    run = _run(tmp_path)
    cold, _ = run.read_steps(cache=False)
    run.read_steps()
    seg = next((run.cache_dir / "steps" / "rank-00001.jsonl.d").glob("*.npy"))
    np.save(seg, np.zeros((2, 3)))  # wrong shape: the JSONL is read instead
    warm, _ = run.read_steps()
    assert not isinstance(warm._cols, _Deferred)
    assert_tables_equal(warm, cold)
    assert isinstance(run.read_steps()[0]._cols, _Deferred)  # rebuilt, deferred again


def test_a_segment_np_save_wrote_is_opened_without_parsing_its_header(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The header is compared with the bytes np.save writes for the manifest's shape; no
    literal_eval of 1,024 headers a run (parsing is for headers written otherwise)."""
    from stepscope.rundir import steps_lazy as _steps_lazy

    run = _run(tmp_path)
    cold, _ = run.read_steps(cache=False)
    run.read_steps()

    def no_parse(fd: int, shape: tuple[int, int]) -> int:
        raise AssertionError(f"parsed the header of a {shape} segment")

    monkeypatch.setattr(_steps_lazy, "_parsed_offset", no_parse)
    warm, _ = run.read_steps()
    assert isinstance(warm._cols, _Deferred)
    assert_tables_equal(warm, cold)


def test_a_segment_with_another_header_layout_is_parsed_and_read(tmp_path: Path) -> None:
    """A version 2.0 header (another numpy's np.save may write one) is not the bytes
    expected: it is parsed, and the segment read from where its data starts."""
    run = _run(tmp_path)
    cold, _ = run.read_steps(cache=False)
    run.read_steps()
    seg = next((run.cache_dir / "steps" / "rank-00001.jsonl.d").glob("*.npy"))
    mat = np.load(seg)
    with open(seg, "wb") as f:
        np.lib.format.write_array(f, mat, version=(2, 0))
    warm, _ = run.read_steps()
    assert isinstance(warm._cols, _Deferred)  # still the cache's
    assert_tables_equal(warm, cold)


def test_columns_dropped_over_the_budget_are_read_again_equal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for one column at a time every access reads again: the table and the
    analyses over it are those of the eager read."""
    from stepscope.analysis.diagnose import diagnose
    from stepscope.analysis.summary import summarize
    from stepscope.rundir import steps_lazy as _steps_lazy

    run = _run(tmp_path, ranks=4, steps=120)
    cold, _ = run.read_steps(cache=False)
    run.read_steps()
    monkeypatch.setattr(_steps_lazy, "RESIDENT_BYTES", 1)
    warm, _ = run.read_steps()
    assert_tables_equal(warm, cold)
    assert len(warm._cols._got) == 1
    assert summarize(warm).to_dict() == summarize(cold).to_dict()
    assert diagnose(warm).to_dict() == diagnose(cold).to_dict()


def test_the_bound_on_columns_held_is_one_for_every_table_of_the_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """compare holds two runs' tables: together they keep at most the bound (plus the
    column just read), the least recently used column of either is dropped first, and a
    dropped column reads again equal."""
    from stepscope.rundir import steps_lazy as _steps_lazy

    runs = [_run(tmp_path / name, ranks=4, steps=120) for name in ("a", "b")]
    colds = [r.read_steps(cache=False)[0] for r in runs]
    for r in runs:
        r.read_steps()  # builds the cache
    col_bytes = 4 * 120 * 8
    monkeypatch.setattr(_steps_lazy, "RESIDENT_BYTES", 5 * col_bytes)
    a, b = (r.read_steps()[0] for r in runs)
    for t in (a, b):  # rank and step of each are held from the start
        assert set(t._cols._got) == {"rank", "step"}
    a["step_time_s"]  # 5 columns held: the bound
    b["step_time_s"]  # over it: a's rank, the oldest, goes
    assert set(a._cols._got) == {"step", "step_time_s"}
    a["step"]  # used again: now b's rank is the oldest
    b["tokens"]
    assert set(b._cols._got) == {"step", "step_time_s", "tokens"}
    cost = _steps_lazy._cost  # a never-recorded column is one shared NaN: 0 bytes
    held = sum(cost(v) for t in (a, b) for v in t._cols._got.values())
    assert held <= 5 * col_bytes and _steps_lazy._RESIDENT.held == held
    for t, cold in zip((a, b), colds, strict=True):
        assert_tables_equal(t, cold)  # every column read again where dropped
    before = _steps_lazy._RESIDENT.held
    n_b = sum(cost(v) for v in b._cols._got.values())
    assert 0 < n_b and before <= 5 * col_bytes + col_bytes
    del b, t  # a collected table's columns no longer count
    gc.collect()
    assert _steps_lazy._RESIDENT.held == before - n_b
