"""The experiment index over run directories written by the real Recorder (injected clock).

Each run's numbers are exact: the clock advances ``step_s`` per read and the recorder reads
it at the start and the end of each step, so every step takes ``step_s`` seconds; tokens
are fixed per step.
Broken runs are made by hand: a corrupt run.json, step records without run.json, a run.json
with no step records yet.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest
from markdown_it import MarkdownIt

import stepscope
from stepscope.errors import ConfigError, RunDirError
from stepscope.report.markdown_tables import index_markdown
from stepscope.rundir.index import (
    COLUMNS,
    best_config,
    build_index,
    parse_where,
    query_index,
    skipped_runs,
)


def write_run(path: Path, *, devices: int, step_s: float, model: str = "gpt-1b",
              steps: int = 6, tokens: float = 4096, evals: dict[str, float] | None = None,
              ) -> None:
    ticks = itertools.count()
    rec = stepscope.Recorder(
        path, rank=0, background=False, clock=lambda: next(ticks) * step_s,
        meta={"name": path.name, "baseline": {
            "model_name": model, "num_devices": devices, "global_batch": 8 * devices,
            "device_kind": "NVIDIA H100 80GB HBM3", "precision": "bf16-mixed",
            "shuffle": True},
            "environment": {"framework": "torch", "framework_version": "2.13.0",
                            "stepscope_version": stepscope.__version__,
                            "flops_per_token": 1e6, "peak_flops_per_device": 1e12}})
    for i in range(steps):
        with rec.step(tokens=tokens, samples=8) as s:
            s.log(loss=3.0 - 0.1 * i)
    rec.close()
    if evals:
        stepscope.RunDir.open(path).append_event({"type": "eval", "step": steps - 1,
                                                  "metrics": evals})


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    # step time 1 s except the first (warm-up) step; tokens/s = 4096 / step_s.
    write_run(tmp_path / "a-8", devices=8, step_s=1.0)
    write_run(tmp_path / "b-8", devices=8, step_s=0.5, evals={"val_loss": 2.4})
    write_run(tmp_path / "nested" / "c-64", devices=64, step_s=0.25, model="gpt-7b")
    write_run(tmp_path / "d-64", devices=64, step_s=0.125, model="gpt-7b")
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "run.json").write_text("{not json")
    (tmp_path / "partial" / "steps").mkdir(parents=True)
    (tmp_path / "partial" / "steps" / "rank-00000.jsonl").write_text('{"step": 0}\n')
    stepscope.RunDir.create(tmp_path / "empty", stepscope.RunMeta(run_id="empty"))
    return tmp_path


def test_build_lists_runs_and_skips_broken_ones(root: Path) -> None:
    res = build_index(root)
    s = res.stats
    assert (s.found, s.read, s.unchanged, s.skipped) == (7, 6, 0, 3)
    reasons = {k.path: k.reason for k in res.skipped}
    assert set(reasons) == {"corrupt", "empty", "partial"}
    assert "run.json is corrupt" in reasons["corrupt"]
    assert reasons["partial"] == "partial run: step records but no run.json"
    assert reasons["empty"].startswith("no step records yet")
    assert skipped_runs(res.db_path) == res.skipped
    rows = query_index(res.db_path, sort="path")
    assert [r["path"] for r in rows] == ["a-8", "b-8", "d-64", "nested/c-64"]
    b = rows[1]
    # 5 steady steps of 0.5 s with 4096 tokens each -> 8192 tokens/s; MFU = 8192 x 1e6 /
    # (8 x 1e12) = 0.001024; 1024 tokens/s per device.
    assert (b["tokens_per_s"], b["tokens_per_s_per_device"], b["mfu"]) == pytest.approx(
        (8192.0, 1024.0, 0.001024))
    assert (b["steps"], b["step_time_s"], b["loss_last"]) == (6, 0.5, pytest.approx(2.5))
    assert (b["framework"], b["framework_version"], b["device_kind"], b["shuffle"]) == (
        "torch", "2.13.0", "NVIDIA H100 80GB HBM3", 1)
    assert orjson.loads(b["evals"]) == {"val_loss": 2.4}
    assert set(b) == set(COLUMNS)


def test_rerun_is_incremental(root: Path) -> None:
    build_index(root)
    again = build_index(root)
    assert (again.stats.read, again.stats.unchanged, again.stats.skipped) == (0, 6, 3)
    # One more record in one run, one new run, one run deleted: only two are read.
    path = root / "a-8" / "steps" / "rank-00000.jsonl"
    with path.open("a") as f:
        f.write('{"rank": 0, "step": 6, "step_time_s": 1.0, "tokens": 4096}\n')
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
    write_run(root / "e-8", devices=8, step_s=2.0)
    import shutil

    shutil.rmtree(root / "d-64")
    third = build_index(root)
    # unchanged: b-8, nested/c-64 and the corrupt and empty runs (skipped, not re-read)
    assert (third.stats.read, third.stats.unchanged, third.stats.removed) == (2, 4, 1)
    rows = {r["path"]: r for r in query_index(third.db_path)}
    assert set(rows) == {"a-8", "b-8", "e-8", "nested/c-64"}
    assert rows["a-8"]["steps"] == 7


def test_filters_sort_and_best(root: Path) -> None:
    db = build_index(root).db_path
    names = [r["name"] for r in query_index(db, ["num_devices=64"], sort="-tokens_per_s")]
    assert names == ["d-64", "c-64"]
    assert [r["name"] for r in query_index(db, ["model_name~1b", "tokens_per_s>5000"])] == [
        "b-8"]
    assert [r["name"] for r in query_index(db, ["num_devices!=64"], sort="step_time_s")] == [
        "b-8", "a-8"]
    row, used = best_config(db, ["model_name=gpt-7b", "num_devices=64"])
    assert row is not None and (row["name"], used) == ("d-64", "mfu")
    assert best_config(db, ["num_devices=1024"]) == (None, "mfu")


def test_where_is_parsed_never_interpolated(root: Path) -> None:
    db = build_index(root).db_path
    assert parse_where("num_devices = 64") == ('"num_devices" = ?', [64])
    assert parse_where("name~a_8%") == ("\"name\" LIKE ? ESCAPE '\\'", ["%a\\_8\\%%"])
    # A value that looks like SQL is just a string that matches nothing.
    assert query_index(db, ["name=x' OR '1'='1"]) == []
    for bad in ("num_devices; DROP TABLE runs", "nope=1", "1=1"):
        with pytest.raises(ConfigError):
            query_index(db, [bad])
    with pytest.raises(ConfigError):
        query_index(db, sort="tokens_per_s; DROP TABLE runs")
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone() == (4,)


def test_markdown_renders_as_a_gfm_table(root: Path) -> None:
    rows = query_index(build_index(root).db_path, sort="path")
    text = index_markdown(rows)
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    assert tokens[0].type == "table_open"
    assert sum(t.type == "tr_open" for t in tokens) == 1 + len(rows)
    header = text.splitlines()[0]
    assert header.startswith("| run | date | framework |") and header.endswith("| loss |")
    assert "| a-8 |" in text.splitlines()[2]


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from stepscope.cli import main

    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out, out.err


def test_cli_index(capsys: pytest.CaptureFixture[str], root: Path, tmp_path: Path) -> None:
    code, out, _ = _main(capsys, "index", str(root), "--json", "--where", "num_devices=8")
    doc: dict[str, Any] = orjson.loads(out)
    assert code == 0
    assert doc["counts"] == {"found": 7, "read": 6, "unchanged": 0, "removed": 0,
                             "skipped": 3}
    assert sorted(r["name"] for r in doc["runs"]) == ["a-8", "b-8"]
    assert [s["path"] for s in doc["skipped"]] == ["corrupt", "empty", "partial"]
    code, out, _ = _main(capsys, "index", str(root), "--best", "num_devices=8", "--json")
    assert orjson.loads(out)["best_by"] == "mfu"
    assert [r["name"] for r in orjson.loads(out)["runs"]] == ["b-8"]
    code, out, _ = _main(capsys, "index", str(root), "--markdown", "--sort", "name")
    assert code == 0 and out.splitlines()[2].startswith("| a-8 |")
    code, out, _ = _main(capsys, "index", str(root))
    assert code == 0 and "skipped corrupt" in out and "d-64" in out
    code, _, err = _main(capsys, "index", str(root), "--where", "bogus=1")
    assert code == 2 and "unknown index column 'bogus'" in err
    code, _, err = _main(capsys, "index", str(tmp_path / "missing"))
    assert code == 2 and "is not a directory" in err


def test_stale_schema_is_rebuilt_and_queries_refuse(tmp_path: Path) -> None:
    write_run(tmp_path / "r", devices=8, step_s=1.0)
    db = tmp_path / "idx.sqlite"
    with sqlite3.connect(db) as con:
        con.execute("PRAGMA user_version = 999")
    with pytest.raises(RunDirError, match="another stepscope version"):
        query_index(db)
    assert build_index(tmp_path, db).stats.read == 1
    assert [r["name"] for r in query_index(db)] == ["r"]


def test_profile_archives_are_indexed_and_trigger_a_reread(root: Path) -> None:
    build_index(root)
    stepscope.RunDir.open(root / "b-8").new_profile_dir("20261130T101500.123Z")
    res = build_index(root)
    assert (res.stats.read, res.stats.unchanged) == (1, 5)
    row = query_index(res.db_path, ["name=b-8"])[0]
    assert orjson.loads(row["profiles"]) == ["profiles/20261130T101500.123Z"]
