"""Zooming a live run in `stepscope serve`: a real `stepscope serve` process over a run that
a real Recorder is writing, in Debian's Chromium. A zoomed page keeps polling: a window in
the past keeps its window while the rest of the page grows; a window that reaches the
newest step follows the live edge."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stepscope.record.recorder import Recorder
from support.browser import ARGS, ARTIFACTS, CHROMIUM, sync_api, wait
from support.serving import origin

STEPSCOPE = str(Path(sys.executable).parent / "stepscope")
STEP_S = 0.05  # the writer's pace: 20 steps per second


@pytest.fixture
def live_run(tmp_path: Path) -> Iterator[tuple[Path, Recorder]]:
    root = tmp_path / "root"
    rec = Recorder(root / "live")
    stop = threading.Event()

    def train() -> None:
        i = 0
        while not stop.is_set():
            with rec.step(tokens=1000, samples=8) as s:
                time.sleep(STEP_S)
                s.log(loss=3.0 / (1 + 0.01 * i))
            i += 1

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    try:
        yield root, rec
    finally:
        stop.set()
        thread.join(timeout=30)
        rec.close()


@pytest.fixture
def serve(live_run: tuple[Path, Recorder]) -> Iterator[str]:
    proc = subprocess.Popen([STEPSCOPE, "serve", str(live_run[0]), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(proc.stdout.readline() if proc.stdout else ""),
                     daemon=True).start()
    try:
        line = lines.get(timeout=60)
        assert " at http://" in line, line + (proc.stderr.read() if proc.poll() else "")
        yield line.split(" at ")[1].split()[0]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def _drag(page: Any, chart: int, lo_step: float | None, hi_step: float | None) -> None:
    """Drag across chart ``chart`` from step ``lo_step`` to ``hi_step`` (None: the edge)."""
    over = page.locator(".chart").nth(chart).locator(".u-over")
    over.scroll_into_view_if_needed()
    box = over.bounding_box()
    def px(step: float | None, edge: float) -> float:
        if step is None:
            return box["x"] + edge
        return box["x"] + page.evaluate(f"charts[{chart}].valToPos({step}, 'x')")
    y = box["y"] + box["height"] / 2
    page.mouse.move(px(lo_step, 1), y)
    page.mouse.down()
    page.mouse.move(px(hi_step, box["width"] - 1), y, steps=8)
    page.mouse.up()


def _x_range(page: Any, chart: int) -> tuple[float, float]:
    lo, hi = page.evaluate(f"[charts[{chart}].data[0][0], charts[{chart}].data[0].at(-1)]")
    return float(lo), float(hi)


def test_a_zoomed_live_chart_keeps_its_window_and_keeps_receiving_data(
        serve: str, live_run: tuple[Path, Recorder]) -> None:
    api = sync_api()
    _, rec = live_run
    deadline = time.monotonic() + 60
    while rec.steps_recorded < 60:
        assert time.monotonic() < deadline, "the recorder did not get to 60 steps"
        time.sleep(0.1)
    with api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        outside: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        base = origin(serve)
        page.on("request", lambda r: None if r.url.startswith(base) else outside.append(r.url))
        page.goto(serve + "#/run/live")
        wait(page, "charts.length > 0 && !document.querySelector('#live').hidden", 60)
        titles = page.eval_on_selector_all(".chart .title", "e => e.map(x => x.textContent)")
        chart = titles.index("Step time (slowest rank)")

        # A window in the past: it stays put while the page keeps polling the run.
        _drag(page, chart, 10, 30)
        wait(page, "!document.querySelector('#whole').hidden")
        lo, hi = _x_range(page, chart)
        assert 9 <= lo and hi <= 31, (lo, hi)
        heat = page.evaluate("document.querySelector('#heat').width")
        # The whole run still refreshes underneath (the heatmap has one column per step).
        wait(page, f"document.querySelector('#heat').width >= {heat + 10}", 60)
        assert _x_range(page, chart) == (lo, hi)

        # A window reaching the newest step follows the live edge, from its own start.
        page.click("#whole")
        wait(page, "document.querySelector('#whole').hidden")
        start = page.evaluate(f"charts[{chart}].data[0].at(-1)") // 2
        _drag(page, chart, start, None)
        wait(page, "!document.querySelector('#whole').hidden")
        lo, hi = _x_range(page, chart)
        assert abs(lo - start) <= 2, (lo, start)
        wait(page, f"charts[{chart}].data[0].at(-1) >= {hi + 10}", 60)
        assert _x_range(page, chart)[0] == lo  # grown at the right, its start kept
        assert page.evaluate("!document.querySelector('#whole').hidden")  # still zoomed
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "serve-live-zoom.png"), full_page=True)
        assert errors == [] and outside == []
        browser.close()
