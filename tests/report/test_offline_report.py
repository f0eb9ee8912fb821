"""The offline HTML report: the dashboard's run page in one file, opened from disk in a real
Chromium with no server: it draws its charts, loads nothing from anywhere, and keeps
run-supplied strings inert."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stepscope import RunMeta, StepTable, summarize
from stepscope.analysis.series import series_doc
from stepscope.report.offline import OFFLINE_CSP, render_offline
from stepscope.report.serve_data import run_doc
from stepscope.rundir.run import Run
from support.browser import embedded, offline_page, report_of
from support.rundirs import run_from_columns

DATA = Path(__file__).resolve().parents[1] / "data"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "test-artifacts"
XSS = "</script><img src=x onerror=window.__xss=1>"


def _report(run_path: Path, out: Path) -> Path:
    run = Run.open(run_path)
    html = render_offline(run_doc(run_path.name, run, run.findings()),
                          run.series(points=5000))
    out.write_text(html, encoding="utf-8")
    return out


def test_report_is_one_file_with_a_csp_and_no_outside_reference(tmp_path: Path) -> None:
    run = tmp_path / "run-ddp-two-ranks"  # a copy: the reader writes its cache beside it
    shutil.copytree(DATA / "run-ddp-two-ranks", run)
    html = _report(run, tmp_path / "r.html").read_text()
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


def _two_regimes(path: Path) -> Path:
    """Steps 0-69 at 3 s with 0.6 CPU-s per wall-s and 200 preemptions/s (a busy host),
    steps 70-149 at 0.5 s on a quiet one: analysis/regimes calls the first contention."""
    st = np.r_[np.full(70, 3.0), np.full(80, 0.5)] * np.tile([0.98, 1.02], 75)
    cols = {"rank": np.zeros(150, dtype=int), "step": np.arange(150), "step_time_s": st,
            "tokens": np.full(150, 1000.0),
            "cpu_s": st * np.r_[np.full(70, 0.6), np.full(80, 1.0)],
            "preempt": st * np.r_[np.full(70, 200.0), np.full(80, 10.0)],
            "wall_time_s": 1000.0 + np.cumsum(st)}
    return run_from_columns(path, cols).path


def test_report_shows_the_regimes_conditions_and_what_was_skipped(tmp_path: Path) -> None:
    report = report_of(_two_regimes(tmp_path / "regimes"))
    doc = embedded(report)["run"]
    rows = doc["text"]["regime_rows"]
    # (the first slow steps are warm-up, outside every regime)
    assert [r[0].split("-")[-1] for r in rows] == ["69", "149"] and rows[1][0][0] == "*"
    assert rows[0][-1].startswith("contention")
    with offline_page(report, "report-regimes") as page:
        shown = page.eval_on_selector_all(
            "#regimes tr", "trs => trs.map(tr => [...tr.cells].map(c => c.textContent))")
        assert shown == [doc["text"]["regime_header"], *rows]
        assert "contention" in page.inner_text("#regime-legend")
        assert page.inner_text("#conditions").startswith("conditions: ")
        # The contention regime is shaded on the step-time chart, with its cause on hover.
        titles = page.eval_on_selector_all(".chart .title", "e => e.map(x => x.textContent)")
        i = titles.index("Step time (slowest rank)")
        rgba = f"""(s) => {{ const u = charts[{i}];
            const x = u.valToPos(s, "x", true), y = u.valToPos(0.25, "y", true);
            return [...u.ctx.getImageData(Math.round(x), Math.round(y), 1, 1).data]; }}"""
        busy, quiet = page.evaluate(f"({rgba})(50)"), page.evaluate(f"({rgba})(110)")
        assert busy[0] > busy[2] + 10 and abs(quiet[0] - quiet[2]) < 10, (busy, quiet)
        over = page.locator(".chart").nth(i).locator(".u-over")
        over.scroll_into_view_if_needed()
        box = over.bounding_box()
        x = page.evaluate(f"charts[{i}].valToPos(50, 'x')")
        page.mouse.move(box["x"] + x, box["y"] + box["height"] / 2)
        page.mouse.move(box["x"] + x + 1, box["y"] + box["height"] / 2)
        hover = page.locator(".chart").nth(i).locator(".regime-at").inner_text()
        assert hover.startswith(f"{rows[0][0]}: contention (steps 6.0x as long"), hover

    shutil.copytree(DATA / "run-torn-last-line", tmp_path / "torn")
    torn = report_of(tmp_path / "torn")
    read = embedded(torn)["run"]["read"]
    assert read["torn_tail"] == 1 or read["skipped"] >= 1
    with offline_page(torn) as page:
        assert "skipped" in page.inner_text("#read-warning")


def test_a_long_phase_split_is_binned_by_mean_and_still_adds_up() -> None:
    n = 10_000
    steps = np.arange(n)
    fwd = np.where(steps % 2 == 0, 0.2, 0.4)
    t = StepTable.from_columns({"rank": np.zeros(n, dtype=int), "step": steps,
                                "step_time_s": fwd + 0.1, "forward_s": fwd})
    doc = series_doc("long", t, summarize(t), RunMeta(run_id="long"), max_points=1000)
    ph = doc["phases"]
    assert len(ph["steps"]) == 1000 and ph["steps"][:3] == [0, 10, 20]
    assert ph["cols"]["forward_s"] == pytest.approx([0.3] * 1000)  # mean of 0.2 and 0.4
    assert ph["cols"]["other_s"] == pytest.approx([0.1] * 1000)
