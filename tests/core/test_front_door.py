"""One run, one answer: every reader reads a run through ``stepscope.open_run``.

The sheet of a run whose later steps ran under a halved CPU clock, and the verdict of a
pair of runs whose hosts were contended differently, are the same through the public API,
``stepscope report/compare/index --json`` and the dashboard's documents (the readers that
each once assembled them their own way: the dashboard called a pair "landed +21%" that the
CLI called inconclusive; the quickstart's ``summarize(table, meta)`` chose other steps
than ``report``).
"""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from click.testing import CliRunner

import stepscope
from stepscope.cli import cli
from stepscope.report.serve import make_server
from stepscope.report.serve_data import Dashboard
from stepscope.schema import RunMeta
from support.browser import ARGS, CHROMIUM, sync_api, wait
from support.rundirs import run_from_columns
from support.serving import at

TOKENS = 1000.0
FAST_S, SLOW_S = 0.1, 0.2  # the clock halved from step 60 on: 3000 -> 1500 MHz
SWITCH, STEPS = 60, 200


def _halved_clock_run(path: Path) -> Path:
    rng = np.random.default_rng(7)
    step = np.arange(STEPS)
    st = np.where(step < SWITCH, FAST_S, SLOW_S) * (1 + 0.01 * rng.standard_normal(STEPS))
    wall = 1000.0 + np.cumsum(st)
    run_from_columns(path, {"rank": np.zeros(STEPS, dtype=np.int64), "step": step,
                            "step_time_s": st, "wall_time_s": wall,
                            "tokens": np.full(STEPS, TOKENS), "loss": 5 - step / 100},
                     RunMeta(run_id=path.name, status="finished",
                             baseline={"seq_len": 128, "global_batch": 8}))
    (path / "conditions").mkdir()
    samples = [{"wall_time_s": float(w), "cpu_mhz": 3000.0 if i < SWITCH else 1500.0}
               for i, w in enumerate(wall) if i % 5 == 0]
    (path / "conditions" / "rank-00000.jsonl").write_bytes(
        b"".join(orjson.dumps(s) + b"\n" for s in samples))
    return path


def _cli_json(*args: str) -> Any:
    res = CliRunner().invoke(cli, [*args, "--json"])
    assert res.exit_code in (0, 1), res.output
    return orjson.loads(res.stdout_bytes)


def _board(root: Path) -> Dashboard:
    board = Dashboard(root, refresh_s=0.0, index_wait_s=300.0)
    board.runs()
    return board


def test_the_halved_clock_run_has_one_sheet_through_every_reader(tmp_path: Path) -> None:
    run = _halved_clock_run(tmp_path / "halved")
    api = stepscope.open_run(run).sheet()
    report = _cli_json("report", str(run), "--no-html")
    index_rows = _cli_json("index", str(tmp_path))["runs"]
    page = _board(tmp_path).run("halved")["sheet"]
    # the regime the door chose: the steps before the clock fell, at full speed
    assert api.steady_regime is not None and "throttling" not in api.steady_regime
    assert api.tokens_per_s == pytest.approx(TOKENS / FAST_S, rel=0.03)
    for doc in (report, page, index_rows[0]):
        assert doc["tokens_per_s"] == api.tokens_per_s
        assert doc["step_time_s"] == api.step_time_s
    assert report["steady_regime"] == page["steady_regime"] == api.steady_regime
    assert report["regimes"] == page["regimes"]
    # the same answer again from the results store, every reader's one cache key
    assert stepscope.open_run(run).sheet() == api


def _pair(root: Path) -> tuple[Path, Path]:
    """Two runs of one configuration; B's host was contended (its training thread queued
    for a CPU half the time) and its steps took longer."""
    out = []
    for name, slow, runq in (("a", 1.0, 0.02), ("b", 1.3, 0.5)):
        rng = np.random.default_rng(len(name) + int(slow * 10))
        step = np.arange(120)
        st = 0.1 * slow * (1 + 0.02 * rng.standard_normal(120))
        wall = 50.0 + np.cumsum(st)
        path = run_from_columns(root / name, {
            "rank": np.zeros(120, dtype=np.int64), "step": step, "step_time_s": st,
            "wall_time_s": wall, "tokens": np.full(120, TOKENS), "loss": 4 - step / 100},
            RunMeta(run_id=name, status="finished",
                    baseline={"seq_len": 128, "global_batch": 8})).path
        (path / "conditions").mkdir()
        samples = [{"wall_time_s": float(w), "main_oncpu_frac": 1 - runq - 0.05,
                    "main_runq_frac": runq} for w in wall[::5]]
        (path / "conditions" / "rank-00000.jsonl").write_bytes(
            b"".join(orjson.dumps(s) + b"\n" for s in samples))
        out.append(path)
    return out[0], out[1]


def test_a_contended_pair_has_one_verdict_on_the_cli_the_dashboard_and_the_api(
        tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    cli_doc = _cli_json("compare", str(a), str(b))
    assert cli_doc["verdict"] == "inconclusive"  # the hosts' conditions differ
    board_doc = _board(tmp_path).compare("a", "b")
    assert orjson.loads(orjson.dumps(board_doc, option=orjson.OPT_SERIALIZE_NUMPY,
                                      default=str)) == cli_doc
    api = stepscope.open_run(a).compare(stepscope.open_run(b))
    assert api.verdict == cli_doc["verdict"]
    assert orjson.loads(orjson.dumps(api.to_dict(), option=orjson.OPT_SERIALIZE_NUMPY,
                                     default=str)) == cli_doc
    with _served(tmp_path) as url:
        with urllib.request.urlopen(at(url, "api/compare?a=a&b=b"), timeout=120) as r:
            assert orjson.loads(r.read()) == cli_doc  # key for key
        # the page shows that verdict, with its environment check
        api_ = sync_api()
        with api_.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page()
            page.goto(url + "#/compare/a/b")
            wait(page, "document.querySelector('.verdict') !== null", 120)
            assert page.inner_text(".verdict") == "inconclusive"
            env = page.inner_text("#env-check")
            assert "conditions differ" in env and "queued for a CPU" in env
            browser.close()


@contextmanager
def _served(root: Path) -> Iterator[str]:
    server = make_server(str(root), port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.url
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)


def test_a_run_that_changes_gets_a_new_key_and_new_numbers(tmp_path: Path) -> None:
    run = _halved_clock_run(tmp_path / "r")
    first = stepscope.open_run(run)
    before = first.sheet().steps
    with open(run / "steps" / "rank-00000.jsonl", "ab") as fh:
        fh.write(orjson.dumps({"rank": 0, "step": STEPS, "step_time_s": FAST_S,
                               "wall_time_s": 5000.0, "tokens": TOKENS}) + b"\n")
    assert first.changed()
    again = stepscope.open_run(run)
    assert again.key != first.key and again.sheet().steps == before + 1
