"""The offline HTML report: the dashboard's run page in one file, opened from disk in a real
Chromium with no server: it draws its charts, loads nothing from anywhere, and keeps
run-supplied strings inert."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from stepscope import RunDir, summarize
from stepscope.report.offline import OFFLINE_CSP, render_offline
from stepscope.report.serve_data import run_doc, series_doc

DATA = Path(__file__).resolve().parents[1] / "data"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "test-artifacts"
XSS = "</script><img src=x onerror=window.__xss=1>"


def _report(run_path: Path, out: Path) -> Path:
    run = RunDir.open(run_path)
    meta, (table, stats) = run.read_meta(), run.read_steps()
    sheet = summarize(table, meta)
    html = render_offline(run_doc(run_path.name, run, table, meta, sheet, stats.problems),
                          series_doc(run_path.name, table, sheet, meta, max_points=5000))
    out.write_text(html, encoding="utf-8")
    return out


def test_report_is_one_file_with_a_csp_and_no_outside_reference(tmp_path: Path) -> None:
    html = _report(DATA / "run-ddp-two-ranks", tmp_path / "r.html").read_text()
    assert OFFLINE_CSP in html
    assert 'src="/' not in html and 'href="/' not in html  # nothing left to fetch


def _wait(page: Any, expr: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(expr):
        assert time.monotonic() < deadline, f"timed out waiting for {expr}"
        page.wait_for_timeout(100)


def test_report_opened_from_disk_draws_every_chart_and_loads_nothing(tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    run = tmp_path / "xss-run"
    shutil.copytree(DATA / "run-ddp-two-ranks", run)
    meta = json.loads((run / "run.json").read_text())
    meta["name"] = XSS
    (run / "run.json").write_text(json.dumps(meta))
    path = _report(run, tmp_path / "report.html")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        requests: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: requests.append(r.url))
        page.goto(path.as_uri())
        _wait(page, "document.querySelectorAll('.uplot').length >= 9")
        assert page.evaluate("charts.every(c => c.data[1].some(v => v !== null))")
        assert XSS in page.inner_text("h2")
        assert page.evaluate("window.__xss === undefined")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "offline-report.png"), full_page=True)
        assert errors == []
        assert requests == [path.as_uri()]
        browser.close()
