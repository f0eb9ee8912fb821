"""A wholly cached run's table reads each column from the cache segments when first used:
the same table as the eager read of the JSONL (columns, their order, values, NaN flags),
and still readable when another reader rebuilds the cache underneath it."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import orjson
import pytest

from stepscope import RunDir, RunMeta
from stepscope._steps_lazy import _Deferred
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
    seg = next((run.cache_dir / "steps").glob("rank-00001.jsonl.*.npy"))
    np.save(seg, np.zeros((2, 3)))  # wrong shape: the JSONL is read instead
    warm, _ = run.read_steps()
    assert not isinstance(warm._cols, _Deferred)
    assert_tables_equal(warm, cold)
    assert isinstance(run.read_steps()[0]._cols, _Deferred)  # rebuilt, deferred again


def test_columns_dropped_over_the_budget_are_read_again_equal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for one column at a time every access reads again: the table and the
    analyses over it are those of the eager read."""
    from stepscope import _steps_lazy
    from stepscope.analysis.diagnose import diagnose
    from stepscope.analysis.summary import summarize

    run = _run(tmp_path, ranks=4, steps=120)
    cold, _ = run.read_steps(cache=False)
    run.read_steps()
    monkeypatch.setattr(_steps_lazy, "RESIDENT_BYTES", 1)
    warm, _ = run.read_steps()
    assert_tables_equal(warm, cold)
    assert len(warm._cols._got) == 1
    assert summarize(warm).to_dict() == summarize(cold).to_dict()
    assert diagnose(warm).to_dict() == diagnose(cold).to_dict()
