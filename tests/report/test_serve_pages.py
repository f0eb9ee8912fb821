"""The run page's documents of a finished run come from the page cache to a fresh server
without reading the step table, equal to the computed ones, and never stale: a change of
the run's files is a miss; a run still being written is not kept; a root where the cache cannot
be written still answers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import orjson
import pytest

from stepscope import RunMeta, StepTable, summarize
from stepscope.report.serve_data import Dashboard, series_doc
from stepscope.report.serve_pages import PAGES_DIR

DATA = Path(__file__).resolve().parents[1] / "data"
WAIT_S = 300.0  # the index is built in a thread; the tests wait for it as long as it takes


def _board(root: Path) -> Dashboard:
    return Dashboard(root, refresh_s=0.0, index_wait_s=WAIT_S)


def _documents(board: Dashboard, rel: str) -> tuple[dict, dict, dict]:  # type: ignore[type-arg]
    board.runs()
    return board.run(rel), board.series(rel), board.findings(rel)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    shutil.copytree(DATA / "run-ddp-two-ranks", tmp_path / "ddp")
    return tmp_path


def test_a_fresh_server_answers_from_the_page_cache_without_the_table(root: Path) -> None:
    first = _documents(_board(root), "ddp")
    assert len(list((root / PAGES_DIR).glob("*.json"))) == 3  # run, series, findings
    board = _board(root)
    again = _documents(board, "ddp")
    assert all(r.loaded_table is None for r in board._cache.values())  # no table read
    assert json.loads(json.dumps(again)) == json.loads(json.dumps(first))
    assert again[1]["series"]["efficiency/step_time_s"]["steps"]  # the real document


def test_a_changed_run_is_computed_again(root: Path) -> None:
    board = _board(root)
    before = _documents(board, "ddp")[1]
    step_file = sorted((root / "ddp" / "steps").glob("rank-*.jsonl"))[0]
    last = json.loads(step_file.read_text().splitlines()[-1])
    last["step"] += 1
    with open(step_file, "a") as fh:
        fh.write(json.dumps(last) + "\n")
    after = _documents(_board(root), "ddp")[1]
    steps = after["series"]["efficiency/step_time_s"]["steps"]
    assert steps[-1] == before["series"]["efficiency/step_time_s"]["steps"][-1] + 1


def test_a_running_run_is_not_kept(root: Path) -> None:
    meta = json.loads((root / "ddp" / "run.json").read_text())
    meta["status"] = "running"
    (root / "ddp" / "run.json").write_text(json.dumps(meta))
    _documents(_board(root), "ddp")
    assert not list((root / PAGES_DIR).glob("*.run.json"))
    assert not list((root / PAGES_DIR).glob("*.series.json"))


def test_a_root_where_pages_cannot_be_kept_still_answers(root: Path) -> None:
    (root / PAGES_DIR).write_text("not a directory")  # every write of the cache fails
    first = _documents(_board(root), "ddp")
    again = _documents(_board(root), "ddp")
    assert again[1]["series"] and json.dumps(again) == json.dumps(first)
    assert [p.name for p in root.iterdir() if p.name.endswith(".tmp")] == []


def test_a_long_runs_series_document_stays_small_and_its_x_axes_exact() -> None:
    """The x axes (wall time, tokens seen) are sent at the steps the charts draw: a
    1,000,000-step run's document was 46 MB, almost all of it the x axes of every step."""
    n = 200_000
    rng = np.random.default_rng(3)
    t = 0.5 + 0.01 * rng.standard_normal(n)
    table = StepTable.from_columns({
        "rank": np.zeros(n, dtype=np.int64), "step": np.arange(n), "step_time_s": t,
        "end_s": np.cumsum(t), "tokens": np.full(n, 4096.0), "loss": np.linspace(9, 2, n)})
    meta = RunMeta(run_id="long", status="finished")
    doc = series_doc("long", table, summarize(table, meta), meta, max_points=2000)
    assert len(orjson.dumps(doc)) < 1_000_000
    drawn = set(doc["series"]["efficiency/step_time_s"]["steps"]) | set(doc["phases"]["steps"])
    wall = doc["x"]["wall_s"]
    assert set(wall["steps"]) <= drawn and set(doc["series"]["result/loss"]["steps"]) <= set(
        wall["steps"])
    full = np.cumsum(t)  # the wall-time axis at each drawn step is the whole run's
    assert np.allclose(wall["value"], full[np.asarray(wall["steps"])], rtol=0, atol=1e-9)
    tokens = doc["x"]["tokens"]
    assert tokens["value"] == [4096.0 * (s + 1) for s in tokens["steps"]]


def test_without_page_documents_the_sheet_comes_from_the_index_store(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A finished run nobody has opened: the index summarised it already (the run's
    results store: the sheet every reader shares), so the page reads the table for its
    series only."""
    import stepscope.rundir.run as run_door

    computed = _documents(_board(root), "ddp")  # the index ran: the sheet is stored
    shutil.rmtree(root / PAGES_DIR)

    def no_summary(*_: object, **__: object) -> None:
        raise AssertionError("summarised again although the index stored the sheet")

    monkeypatch.setattr(run_door, "summarize", no_summary)
    board = _board(root)
    again = _documents(board, "ddp")
    # the table was read (for the series), the sheet was not made
    assert any(r.loaded_table is not None for r in board._cache.values())
    assert json.loads(json.dumps(again)) == json.loads(json.dumps(computed))
