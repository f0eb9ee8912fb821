"""A long run with nothing cached: `stepscope serve` answers its run page first from a sample
of the step files, marked partial, then with the full documents, which are byte for byte
what a server that never samples answers; the page says so and redraws without a reload.

The size past which the server samples is lowered for the test (a few MB of step files
instead of a GB). The root is indexed and the run's step cache then removed: the index
does not read the run again (its files are unchanged), so the server's read is the only
one and the run is cold for it."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from stepscope.errors import StepscopeError
from stepscope.report import serve_index
from stepscope.report.serve import DashboardServer, make_server
from stepscope.report.serve_pages import PAGES_DIR
from stepscope.rundir.index import build_index
from stepscope.rundir.run import Run
from stepscope.rundir.steps_sample import sample_step_files
from stepscope.rundir.store import RunDir
from support.browser import ARGS, ARTIFACTS, CHROMIUM, sync_api, wait
from support.serving import at

STEPS, RANKS = 6000, 3  # ~2.3 MB of step files
SPIKE_STEP, SPIKE_S = 4321, 9.5  # one slow step on rank 0: the full view must keep it
LIMITS = {"partial_bytes": 512 << 10, "sample_bytes": 96 << 10}
WAIT_S = 120.0  # the full read in the server's thread: waited for as long as it takes


def write_run(path: Path, steps: int = STEPS, ranks: int = RANKS) -> None:
    (path / "steps").mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({
        "run_id": path.name, "name": path.name, "created_utc": "2026-12-01T00:00:00Z",
        "status": "finished", "baseline": {"num_devices": ranks}, "environment": {},
        "config": {}, "schema_version": 1}))
    for r in range(ranks):
        with open(path / "steps" / f"rank-{r:05d}.jsonl", "w") as fh:
            end = 0.0
            for s in range(steps):
                t = 0.5 + 0.01 * ((7 * s + r) % 5) + (SPIKE_S if (s, r) == (SPIKE_STEP, 0)
                                                       else 0.0)
                end += t
                fh.write(json.dumps({"rank": r, "step": s, "end_s": round(end, 6),
                                     "step_time_s": round(t, 6), "forward_s": 0.3 * t,
                                     "backward_s": 0.6 * t, "tokens": 4096.0,
                                     "loss": 2.0 + 8.0 / (1 + s / 500), "lr": 3e-4}) + "\n")


def _cold_indexed(root: Path) -> None:
    build_index(root)
    shutil.rmtree(root / "long" / ".cache")


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    """The same run twice: one root for the sampling server, one for the reference."""
    write_run(tmp_path / "a" / "long")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    for root in (tmp_path / "a", tmp_path / "b"):
        _cold_indexed(root)
    return tmp_path / "a", tmp_path / "b"


@contextmanager
def _serve(root: Path, **limits: Any) -> Iterator[DashboardServer]:
    server = make_server(str(root), port=0, **limits)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)


@pytest.fixture
def sampling(roots: tuple[Path, Path]) -> Iterator[DashboardServer]:
    with _serve(roots[0], **LIMITS) as server:
        yield server


@pytest.fixture
def reference(roots: tuple[Path, Path]) -> Iterator[DashboardServer]:
    with _serve(roots[1], partial_bytes=None) as server:  # never samples: full reads only
        yield server


def _get(server: DashboardServer, query: str) -> bytes:
    with urllib.request.urlopen(at(server.url, query), timeout=WAIT_S) as r:
        body: bytes = r.read()
    return body


def _docs(server: DashboardServer) -> tuple[bytes, bytes]:
    return (_get(server, "api/run?path=long&findings=0"),
            _get(server, "api/series?path=long"))


def test_first_a_marked_sample_then_the_full_documents_unchanged(
        roots: tuple[Path, Path], sampling: DashboardServer,
        reference: DashboardServer) -> None:
    run, series = (orjson.loads(d) for d in _docs(sampling))
    for doc in (run, series):
        part = doc["partial"]
        assert part["sheet"] == "sample"  # no stored sheet: the numbers are the sample's
        assert 0 < part["records"] < STEPS * RANKS
        assert part["bytes_read"] < part["bytes_total"]
        assert abs(part["estimated_records"] - STEPS * RANKS) < 0.05 * STEPS * RANKS
    drawn = series["series"]["efficiency/step_time_s"]["steps"]
    assert drawn[0] == 0 and drawn[-1] == STEPS - 1  # the whole step range, sampled
    assert len(drawn) < STEPS
    assert run["sheet"]["steps"] == len(drawn)  # the sample's sheet, said to be one
    assert not list((roots[0] / PAGES_DIR).glob("*.series.json"))  # a sample is not kept

    deadline = time.monotonic() + WAIT_S
    while True:
        full = _docs(sampling)
        if not any(orjson.loads(d).get("partial") for d in full):
            break
        assert time.monotonic() < deadline, "the full documents never came"
        time.sleep(0.2)
    assert full == _docs(reference)  # byte for byte what the server answered before
    step_time = orjson.loads(full[1])["series"]["efficiency/step_time_s"]
    assert max(h for h in step_time["hi"] if h is not None) > 2.0  # the spike is kept
    assert list((roots[0] / PAGES_DIR).glob("*.series.json"))  # the full one is


def test_a_run_with_a_stored_sheet_shows_it_during_the_sample(roots: tuple[Path, Path],
                                                             ) -> None:
    run = Run.open(roots[1] / "long")
    run.sheet()  # the sheet every reader keeps in the run's results store
    shutil.rmtree(run.path / ".cache" / "steps")  # the steps not cached any more
    with _serve(roots[1], **LIMITS) as server:
        run = orjson.loads(_get(server, "api/run?path=long&findings=0"))
        assert run["partial"]["sheet"] == "stored"
        assert run["sheet"]["steps"] == STEPS  # the real numbers, not the sample's


def test_the_sample_is_the_runs_own_records_across_the_files(tmp_path: Path) -> None:
    write_run(tmp_path / "long")
    run = RunDir.open(tmp_path / "long")
    with open(run.step_files()[1], "ab") as fh:
        fh.write(b'{"rank": 1, "step": 99999, "step_ti')  # a torn last line: not sampled
    sample = sample_step_files(run.step_files(), 64 << 10, windows=16)
    full, _ = run.read_steps(cache=False)
    assert 0 < sample.records < len(full)
    assert sample.bytes_read <= (64 << 10) + 3 * 4096
    key = full["rank"] * STEPS + full["step"]
    at = np.searchsorted(key, sample.table["rank"] * STEPS + sample.table["step"])
    assert np.array_equal(key[at], sample.table["rank"] * STEPS + sample.table["step"])
    for col in ("step_time_s", "loss", "end_s"):
        assert np.array_equal(full[col][at], sample.table[col])
    for r in range(RANKS):
        steps = sample.table["step"][sample.table["rank"] == r]
        assert steps.min() == 0 and steps.max() == STEPS - 1  # first and last window


def test_the_page_says_it_is_a_sample_then_redraws_in_full(sampling: DashboardServer
                                                           ) -> None:
    api = sync_api()
    errors: list[str] = []
    with api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(sampling.url + "#/run/long")
        wait(page, "charts.length > 0 || document.querySelector('#app .err') !== null")
        assert "Provisional view" in page.inner_text("#partial")
        assert "estimates from that sample" in page.inner_text("#partial")
        assert page.evaluate("document.querySelector('#sheet.provisional') !== null")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "serve-partial.png"))
        wait(page, "document.querySelector('#partial') === null && charts.length > 0",
             WAIT_S)
        assert not page.evaluate("document.querySelector('#sheet.provisional') !== null")
        assert page.evaluate("location.hash") == "#/run/long"  # no navigation
        wait(page, "!document.querySelector('#findings').innerText.includes('Diagnosing')",
             WAIT_S)
        browser.close()
    assert errors == []


def test_a_full_read_that_fails_reaches_the_page(sampling: DashboardServer,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The sample shows, the full read fails: the page then says why (not the sample for
    ever), and the API answers the error rather than sampling again."""
    shown = threading.Event()

    def fail(self: RunDir, **kwargs: Any) -> Any:
        shown.wait(WAIT_S)  # fails once the page shows the sample
        raise StepscopeError(f"{self.path.name}: the disk went away")

    monkeypatch.setattr(RunDir, "start_read_steps", fail)
    api = sync_api()
    with api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page()
        page.goto(sampling.url + "#/run/long")
        wait(page, "document.querySelector('#partial') !== null")  # the sample first
        shown.set()
        wait(page, "document.querySelector('#app .err') !== null", WAIT_S)
        assert "the disk went away" in page.inner_text("#app .err")
        browser.close()
    with pytest.raises(urllib.error.HTTPError) as err:
        _get(sampling, "api/series?path=long")
    assert err.value.code == 400 and b"the disk went away" in err.value.read()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own nice: Linux")
def test_the_index_refresh_runs_below_the_requests(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The refresh's thread (and the processes it forks) yields the CPUs to the requests; the
    rest of the server keeps its priority."""
    write_run(tmp_path / "short", steps=20, ranks=1)
    before = os.getpriority(os.PRIO_PROCESS, 0)
    seen: list[int] = []
    real = serve_index.build_index

    def build(*args: Any, **kwargs: Any) -> Any:
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return real(*args, **kwargs)

    monkeypatch.setattr(serve_index, "build_index", build)
    runs = serve_index.RunList(tmp_path, refresh_s=0.0, wait_s=WAIT_S)
    rows, _, indexing = runs.rows()
    assert not indexing and [r["path"] for r in rows] == ["short"]
    assert seen == [min(19, before + serve_index.INDEX_NICE)]
    assert os.getpriority(os.PRIO_PROCESS, 0) == before  # this thread: unchanged
