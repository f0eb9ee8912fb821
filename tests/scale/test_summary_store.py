"""The summary store: a command's results kept with the run's cache, reused while the run's
files are unchanged, recomputed (and equal to a fresh computation) as soon as one changes.

Every check runs the real CLI in a subprocess and compares the stored answer with the one
computed from the records with no store at all (``.cache/summary`` removed first).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest

from stepscope import RunDir, RunMeta
from stepscope.rundir.results import Stored
from support.rundirs import run_from_columns

_RANKS, _STEPS = 4, 300


def _columns(seed: int, slow_rank: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    rank = np.repeat(np.arange(_RANKS), _STEPS)
    step = np.tile(np.arange(_STEPS), _RANKS)
    st = 1.0 + rng.normal(0, 0.01, rank.size) + 0.2 * (rank == slow_rank)
    st[step == 0] *= 3
    return {"rank": rank, "step": step, "step_time_s": st, "data_wait_s": 0.05 * st,
            "forward_s": 0.3 * st, "backward_s": 0.5 * st, "optimizer_s": 0.1 * st,
            "tokens": np.full(rank.size, 4096.0), "samples": np.full(rank.size, 8.0),
            "loss": 3.0 / (1 + step / 100) + rng.normal(0, 0.01, rank.size),
            "lr": np.full(rank.size, 3e-4), "grad_norm": rng.gamma(2.0, 0.2, rank.size),
            "mem_peak_bytes": np.full(rank.size, 2e9)}


def _meta(name: str, batch: int) -> RunMeta:
    return RunMeta(run_id=name, status="finished",
                   baseline={"num_devices": _RANKS, "global_batch": batch, "seq_len": 512},
                   environment={"flops_per_token": 6e8, "peak_flops_per_device": 1e14})


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    a = run_from_columns(tmp_path / "a", _columns(1), _meta("a", 32)).path
    b = run_from_columns(tmp_path / "b", _columns(2), _meta("b", 64)).path
    return a, b


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "stepscope", *map(str, args)],
                          capture_output=True, text=True, timeout=180, env=dict(os.environ))
    assert proc.returncode in (0, 1), proc.stderr
    return proc


def _fresh(run: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """The command computed from the records: no stored result anywhere."""
    for p in (run, *[Path(a) for a in args if Path(a).is_dir()]):
        shutil.rmtree(p / ".cache" / "summary", ignore_errors=True)
    return _cli(*args)


def _entries(run: Path) -> list[Path]:
    return sorted((run / ".cache" / "summary").glob("*.json"))


COMMANDS = {
    "report --json": lambda a, b: ("report", a, "--json", "--no-html"),
    "report": lambda a, b: ("report", a, "--no-html"),
    "diagnose --json": lambda a, b: ("diagnose", a, "--json"),
    "diagnose": lambda a, b: ("diagnose", a),
    "compare --json": lambda a, b: ("compare", a, b, "--json", "--allow-multi"),
    "compare": lambda a, b: ("compare", a, b, "--allow-multi"),
    "compare --markdown": lambda a, b: ("compare", a, b, "--markdown"),
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_stored_answer_equals_the_computed_one(runs: tuple[Path, Path], name: str) -> None:
    a, b = runs
    argv = COMMANDS[name](a, b)
    first = _cli(*argv)
    stored = _entries(a)
    assert stored, "the first run stores its result"
    again = _cli(*argv)
    assert (again.stdout, again.returncode) == (first.stdout, first.returncode)
    fresh = _fresh(a, *argv)
    assert (fresh.stdout, fresh.returncode) == (first.stdout, first.returncode)


def test_compare_views_are_drawn_from_the_one_stored_comparison(runs: tuple[Path, Path]
                                                                ) -> None:
    """The terminal view, the Markdown table and --json share one entry; a view is drawn
    from the comparison rebuilt from it only when it was stored whole."""
    a, b = runs
    fresh_json = _fresh(a, "compare", a, b, "--json", "--allow-multi")
    text = _cli("compare", a, b, "--allow-multi")
    (entry,) = _entries(a)
    d = orjson.loads(entry.read_bytes())
    assert d["doc"]["whole"] is True and d["doc"]["names"] == ["a", "b"]
    assert _cli("compare", a, b, "--json", "--allow-multi").stdout == fresh_json.stdout
    d["doc"]["comparison"]["speed"]["reason"] = "planted reason"
    entry.write_bytes(orjson.dumps(d))
    planted = _cli("compare", a, b, "--allow-multi").stdout
    assert "planted reason" in planted and planted != text.stdout
    d["doc"]["whole"] = False  # a comparison that did not survive JSON: computed again
    entry.write_bytes(orjson.dumps(d))
    assert _cli("compare", a, b, "--allow-multi").stdout == text.stdout
    assert len(_entries(a)) == 1


def test_the_store_is_what_a_warm_run_reads(runs: tuple[Path, Path]) -> None:
    """White box: an entry edited in place (its key kept) is what the next run prints;
    one with a wrong key or garbage bytes is ignored, recomputed and rewritten."""
    a, _ = runs
    first = orjson.loads(_cli("diagnose", a, "--json").stdout)
    (entry,) = _entries(a)
    d = orjson.loads(entry.read_bytes())
    d["doc"]["diagnosis"]["bottleneck"] = "planted"
    entry.write_bytes(orjson.dumps(d))
    assert orjson.loads(_cli("diagnose", a, "--json").stdout)["bottleneck"] == "planted"
    for bad in (orjson.dumps({**d, "key": "0" * 40}), b"\x00not json"):
        entry.write_bytes(bad)
        assert orjson.loads(_cli("diagnose", a, "--json").stdout) == first
        assert orjson.loads(entry.read_bytes())["key"] == d["key"]  # rewritten


def _append_step(run: Path, rank: int, step: int) -> None:
    with open(run / "steps" / f"rank-{rank:05d}.jsonl", "ab") as f:
        f.write(orjson.dumps({"rank": rank, "step": step, "step_time_s": 9.0,
                              "tokens": 4096.0, "loss": 1.0}) + b"\n")


@pytest.mark.parametrize("change", ["step appended", "run.json", "event appended"])
def test_a_changed_file_is_recomputed(runs: tuple[Path, Path], change: str) -> None:
    a, b = runs
    before = {n: _cli(*COMMANDS[n](a, b)).stdout for n in COMMANDS}
    if change == "step appended":
        _append_step(a, 1, _STEPS)
    elif change == "run.json":
        RunDir.open(a).update_meta(name="renamed")
    else:
        RunDir.open(a).append_event({"type": "finding", "category": "stall",
                                     "severity": "warning", "message": "a stall", "rank": 0})
    changed = 0
    for n, argv in COMMANDS.items():
        after = _cli(*argv(a, b)).stdout
        assert after == _fresh(a, *argv(a, b)).stdout, n
        changed += after != before[n]
    assert changed  # the change shows somewhere: the old answer was not served


def test_steps_appended_show_in_the_sheet(runs: tuple[Path, Path]) -> None:
    a, _ = runs
    argv = ("report", a, "--json", "--no-html")
    assert orjson.loads(_cli(*argv).stdout)["steps"] == _STEPS
    for r in range(_RANKS):
        _append_step(a, r, _STEPS)
    assert orjson.loads(_cli(*argv).stdout)["steps"] == _STEPS + 1


def test_html_page_stored_and_redrawn_when_the_run_changes(runs: tuple[Path, Path],
                                                            tmp_path: Path) -> None:
    a, _ = runs
    pages = []
    for i in range(2):
        _cli("report", a, "--json", "--html", tmp_path / f"p{i}.html")
        pages.append((tmp_path / f"p{i}.html").read_bytes())
    assert pages[0] == pages[1]
    assert any(p.name.startswith("page-") for p in _entries(a))
    _append_step(a, 0, _STEPS)
    _cli("report", a, "--json", "--html", tmp_path / "p2.html")
    _fresh(a, "report", a, "--json", "--html", tmp_path / "p3.html")
    assert (tmp_path / "p2.html").read_bytes() == (tmp_path / "p3.html").read_bytes()
    assert (tmp_path / "p2.html").read_bytes() != pages[0]


def test_running_run_is_not_diagnosed_from_the_store(runs: tuple[Path, Path]) -> None:
    """A running run's diagnosis depends on the clock (a live stall): never stored."""
    a, _ = runs
    RunDir.open(a).update_meta(status="running")
    _cli("diagnose", a, "--json")
    assert not any(p.name.startswith("diagnose-") for p in _entries(a))


def test_put_refused_when_the_files_changed_meanwhile(runs: tuple[Path, Path]) -> None:
    a, _ = runs
    entry = Stored([a], "unit", {"x": 1})
    assert entry.get() is None
    _append_step(a, 0, _STEPS)  # a writer appends while the result is computed
    assert not entry.put({"v": 1})
    assert Stored([a], "unit", {"x": 1}).get() is None
    fresh = Stored([a], "unit", {"x": 1})
    assert fresh.put({"v": 1, "nan": float("nan")})
    assert Stored([a], "unit", {"x": 1}).get() == {"v": 1, "nan": None}
    assert Stored([a], "unit", {"x": 2}).get() is None  # other parameters, other entry


def test_index_reads_the_stored_sheet_and_recomputes_a_changed_run(
        runs: tuple[Path, Path], tmp_path: Path) -> None:
    from stepscope.rundir.index import build_index, query_index

    def rows(db: Path) -> list[dict[str, object]]:
        build_index(tmp_path, db)
        return [{k: v for k, v in r.items() if k != "indexed_utc"}
                for r in query_index(db, [], "path")]

    a, _ = runs
    first = rows(tmp_path / "i1.sqlite")
    assert any(p.name.startswith("sheet-") for p in _entries(a))
    assert rows(tmp_path / "i2.sqlite") == first  # a new index, from the stored sheets
    for p in (a, runs[1]):
        shutil.rmtree(p / ".cache" / "summary")
    assert rows(tmp_path / "i3.sqlite") == first  # and from the records
    for r in range(_RANKS):
        _append_step(a, r, _STEPS)
    steps = {r["path"]: r["steps"] for r in rows(tmp_path / "i4.sqlite")}
    assert steps == {"a": _STEPS + 1, "b": _STEPS}


def test_the_commands_own_outputs_are_not_inputs(runs: tuple[Path, Path]) -> None:
    """report.html, .cache/ and hidden files (temporary files) leave the state as it was;
    any other file of the run directory changes it."""
    a, _ = runs
    key = Stored([a], "unit", {}).key
    assert key is not None
    (a / "report.html").write_text("<html></html>")
    (a / ".cache" / "steps").mkdir(parents=True, exist_ok=True)
    (a / ".cache" / "steps" / "x.npy").write_bytes(b"0")
    (a / ".report.html.123.tmp").write_text("partial")
    assert Stored([a], "unit", {}).key == key
    (a / "conditions").mkdir(exist_ok=True)
    (a / "conditions" / "rank-00000.jsonl").write_text("{}\n")
    assert Stored([a], "unit", {}).key != key


def test_a_small_file_rewritten_in_place_at_the_same_size_is_a_change(
        runs: tuple[Path, Path]) -> None:
    """Within one timestamp tick an in-place rewrite can keep size and mtime: small files
    (run.json, events, conditions) are told apart by their content."""
    a, _ = runs
    events = a / "events.jsonl"
    events.write_bytes(b'{"type": "note", "v": "aaaa"}\n')
    key = Stored([a], "unit", {}).key
    st = events.stat()
    with open(events, "r+b") as f:
        f.write(b'{"type": "note", "v": "bbbb"}\n')
    os.utime(events, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert events.stat().st_size == st.st_size and events.stat().st_mtime_ns == st.st_mtime_ns
    assert Stored([a], "unit", {}).key != key
