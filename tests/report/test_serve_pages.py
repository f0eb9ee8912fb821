"""The run page's documents of a finished run come from the page cache to a fresh server
without reading the step table, equal to the computed ones, and never stale: a change of
the run's files is a miss; a run still being written is not kept; a root where the cache cannot
be written still answers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from stepscope.report.serve_data import Dashboard
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
    assert board._cache == {}  # no step table was read
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
