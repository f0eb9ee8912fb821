"""Corrupt or hostile inputs give a one-line message or a warning, never a traceback.

Covered here (the step-table and run.json type checks are the reader's own tests): rich
markup in run strings, zero readable records in `diagnose`, a corrupt events.jsonl, a
read-only run directory, a corrupt run.json's advice, a corrupt run inside an index root,
a concurrent index writer, and broken rank traces.
"""

from __future__ import annotations

import gzip
import json
import os
import sqlite3
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from stepscope.record.recorder import Recorder
from support.browser import embedded
from support.procs import no_traceback, stepscope
from support.traces import cpu_step_events, ev, thread_name, write_trace


def _make_run(path: Path, steps: int = 12) -> Path:
    """A finished run with exact step times (0.1 s), written through the recorder."""
    t = [0.0]

    def clock() -> float:
        return t[0]

    rec = Recorder(path, {"run_id": path.name}, rank=0, clock=clock,
                   wall_clock=lambda: 1.7e9 + t[0], background=False, no_usage=True)
    for i in range(steps):
        rec.start_step(tokens=1000.0, samples=4.0)
        t[0] += 0.1
        rec.log(loss=3.0 - 0.01 * i)
        rec.end_step()
    rec.close()
    return path


def _text(proc: subprocess.CompletedProcess[str]) -> str:
    return " ".join((proc.stdout + proc.stderr).split())


def test_rich_markup_in_run_strings_is_printed_literally(tmp_path: Path) -> None:
    run = _make_run(tmp_path / "run")
    finding = {"type": "finding", "category": "data_pipeline", "severity": "warning",
               "message": "slow reads from [/data/train] and [red]shard 3[/red]",
               "recommendation": "check [bold]x[/bold]"}
    (run / "events.jsonl").write_bytes(orjson.dumps(finding) + b"\n")
    proc = stepscope("report", str(run), "--no-html")
    no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    text = _text(proc)
    assert "[/data/train]" in text and "[red]shard 3[/red]" in text, text


def test_diagnose_without_readable_records_exits_2(tmp_path: Path) -> None:
    run = _make_run(tmp_path / "run")
    (run / "steps" / "rank-00000.jsonl").write_bytes(b'{"step": "x"}\nnot json\n')
    for cmd in ("diagnose", "report"):
        proc = stepscope(cmd, str(run))
        no_traceback(proc)
        assert proc.returncode == 2, proc.stdout
        assert "no readable step records" in proc.stderr and "no findings" not in proc.stdout


def test_corrupt_events_file_is_mentioned(tmp_path: Path) -> None:
    run = _make_run(tmp_path / "run")
    (run / "events.jsonl").write_bytes(b'{"type": "x"}\n{broken\n{"type": "y"}\n')
    for cmd in (("diagnose",), ("report", "--no-html")):
        proc = stepscope(*cmd[:1], str(run), *cmd[1:])
        no_traceback(proc)
        assert proc.returncode == 0
        assert "1 corrupt record(s) in events.jsonl skipped" in proc.stderr


def test_corrupt_run_json_message_names_no_missing_flag(tmp_path: Path) -> None:
    run = _make_run(tmp_path / "run")
    (run / "run.json").write_bytes(b'{"run_id": ')
    proc = stepscope("report", str(run))
    no_traceback(proc)
    assert proc.returncode == 2 and "is corrupt" in proc.stderr
    assert "--ignore-meta" not in proc.stderr
    flags = stepscope("report", "--help").stdout
    assert all(f in flags for f in ("--html", "--json", "--no-html"))


@pytest.fixture(params=["run", "/../../../victim"])
def read_only_run(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A run directory this process cannot write: a read-only bind mount as root. Its
    run_id is plain, or a path that once chose where the fallback report was written."""
    run = _make_run(tmp_path / "run")
    meta = orjson.loads((run / "run.json").read_bytes())
    (run / "run.json").write_bytes(orjson.dumps({**meta, "run_id": request.param}))
    if os.geteuid() != 0:
        run.chmod(0o555)
        yield run
        run.chmod(0o755)
        return
    ro = tmp_path / "ro"
    ro.mkdir()
    for args in (["mount", "--bind", str(run), str(ro)],
                 ["mount", "-o", "remount,ro,bind", str(ro)]):
        done = subprocess.run(args, capture_output=True, timeout=30)
        if done.returncode != 0:
            subprocess.run(["umount", str(ro)], capture_output=True, timeout=30)
            pytest.skip(f"cannot make a read-only bind mount: {done.stderr.decode().strip()}")
    try:
        yield ro
    finally:
        subprocess.run(["umount", "-l", str(ro)], capture_output=True, timeout=30)


def test_report_on_read_only_run_prints_sheet_and_says_where_html_went(
        read_only_run: Path, tmp_path: Path) -> None:
    proc = stepscope("report", str(read_only_run), env={**os.environ,
                                                        "TMPDIR": str(tmp_path)})
    no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    assert "health-check sheet" in proc.stdout
    spares = list(tmp_path.glob("stepscope-report-*/report.html"))
    assert len(spares) == 1, list(tmp_path.iterdir())
    spare = spares[0]
    assert spare.is_file() and f"wrote it to {spare} instead" in _text(proc)
    assert spare.parent.stat().st_mode & 0o777 == 0o700  # the report is nobody else's
    assert embedded(spare)["run"]["path"] == read_only_run.name  # the whole report, not a stub
    assert not (read_only_run / "report.html").exists()


def test_index_skips_a_corrupt_run_and_indexes_the_others(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _make_run(root / "good")
    bad = _make_run(root / "bad")
    meta = json.loads((bad / "run.json").read_text())
    meta["environment"] = [1]  # a wrong type inside an otherwise valid run.json
    (bad / "run.json").write_text(json.dumps(meta))
    broken = _make_run(root / "broken")
    (broken / "run.json").write_text("{not json")
    proc = stepscope("index", str(root), "--json")
    no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    # the wrong-typed field is dropped (the reader's validation) and the run's records kept;
    # the unreadable run.json is skipped with its reason, and neither stops the scan
    assert [r["path"] for r in out["runs"]] == ["bad", "good"], out
    assert [s["path"] for s in out["skipped"]] == ["broken"]


def test_index_waits_for_a_concurrent_writer(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _make_run(root / "a")
    assert stepscope("index", str(root)).returncode == 0
    db = root / ".stepscope-index.sqlite"
    locked, release = threading.Event(), threading.Event()

    def writer() -> None:  # another indexer in the middle of a long scan: holds the lock
        con = sqlite3.connect(db, timeout=30)
        con.execute("BEGIN IMMEDIATE")
        locked.set()
        release.wait(30)
        con.commit()
        con.close()

    th = threading.Thread(target=writer)
    th.start()
    assert locked.wait(30)
    _make_run(root / "b")
    # Held past sqlite's default 5 s busy timeout, which used to fail as "database is locked".
    timer = threading.Timer(6.0, release.set)
    timer.start()
    try:
        proc = stepscope("index", str(root), "--json")
    finally:
        release.set()
        timer.cancel()
        th.join(30)
    no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    assert sorted(r["path"] for r in json.loads(proc.stdout)["runs"]) == ["a", "b"]


def _rank_trace(path: Path, rank: int, extra: tuple[dict[str, object], ...] = ()) -> Path:
    events = [thread_name(1, "python3"), thread_name(2, "gloo:worker"),
              *cpu_step_events(0, 1), *cpu_step_events(100, 2), *extra]
    return write_trace(path, events, rank=rank)


def test_truncated_rank_trace_is_skipped_while_the_others_are_analysed(tmp_path: Path
                                                                      ) -> None:
    _rank_trace(tmp_path / "rank0.pt.trace.json.gz", 0)
    whole = _rank_trace(tmp_path / "rank1.pt.trace.json.gz", 1).read_bytes()
    (tmp_path / "rank1.pt.trace.json.gz").write_bytes(whole[: len(whole) // 2])
    proc = stepscope("trace", str(tmp_path), "--json")
    no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert list(out["ranks"]) == ["0"]
    assert any("rank1.pt.trace.json.gz" in w and "truncated" in w for w in out["warnings"])


def test_truncated_gzip_is_called_truncated(tmp_path: Path) -> None:
    path = tmp_path / "rank0.pt.trace.json.gz"
    data = gzip.compress(orjson.dumps({"traceEvents": [ev("aten::mm", 0, 1)] * 2000}))
    path.write_bytes(data[:40])  # too short even for the format sniffing
    proc = stepscope("trace", str(path))
    no_traceback(proc)
    assert proc.returncode == 2 and "truncated gzip" in proc.stderr, proc.stderr


def test_invalid_op_durations_are_rejected_and_counted(tmp_path: Path) -> None:
    bad = (ev("aten::mm", 20, -5.0), ev("aten::mm", 30, 1e300))
    path = _rank_trace(tmp_path / "rank0.pt.trace.json", 0, bad)
    proc = stepscope("trace", str(path), "--json")
    no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert any("2 events with a negative or implausible duration" in w
               for w in out["warnings"]), out["warnings"]
    # The 1e300 event did not become the step: compute is the two steps' own ops.
    assert out["ranks"]["0"]["compute_pct"] < 100


def test_stall_is_not_inferred_across_lost_records(tmp_path: Path) -> None:
    run = _make_run(tmp_path / "run", steps=20)
    f = run / "steps" / "rank-00000.jsonl"
    lines = f.read_bytes().splitlines()
    f.write_bytes(b"\n".join(lines[:5] + lines[15:]) + b"\n")  # steps 5..14 lost
    proc = stepscope("diagnose", str(run), "--json")
    no_traceback(proc)
    cats = [x["category"] for x in json.loads(proc.stdout)["findings"]]
    assert "stall" not in cats
