"""A real browser for the report and dashboard tests: Debian's chromium driven by Playwright
through its ``executable_path`` (no browser download); a test skips with the reason where
either is absent.

Example::

    with offline_page(run / "report.html", "report-demo") as page:
        assert page.inner_text("[data-k=tokens_per_s]") == "1,234"
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
# Screenshots of each page, kept after the run for a person to look at (build/ is ignored).
ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "test-artifacts"
# The run page is drawn: the charts exist (or the page said why it could not draw them).
DRAWN = ("document.querySelector('#app .err') !== null || "
         "(document.querySelector('#charts') !== null && charts.length > 0)")


def sync_api() -> Any:
    api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    return api


def wait(page: Any, expr: str, timeout_s: float = 30.0) -> None:
    """Poll ``expr`` from outside the page: the page's own CSP forbids the eval that
    Playwright's wait_for_function runs inside it (which is the point of the CSP)."""
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(expr):
        assert time.monotonic() < deadline, f"timed out waiting for {expr}"
        page.wait_for_timeout(100)


def embedded(report: Path) -> dict[str, Any]:
    """The documents a report.html embeds, parsed as plain JSON (no stepscope code)."""
    text = report.read_text(encoding="utf-8")
    start = text.index('id="stepscope-data">') + len('id="stepscope-data">')
    return orjson.loads(text[start:text.index("</script>", start)])  # type: ignore[no-any-return]


@contextmanager
def offline_page(report: Path, shot: str | None = None,
                 viewport: tuple[int, int] = (1400, 1000)) -> Iterator[Any]:
    """``report`` opened from ``file://`` and drawn; on leaving, the page raised no error
    and asked for nothing but the file itself (a screenshot ``shot``.png is saved first)."""
    api = sync_api()
    with api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
            errors: list[str] = []
            requests: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(report.resolve().as_uri())
            wait(page, DRAWN)
            yield page
            if shot:
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / f"{shot}.png"), full_page=True)
            assert errors == []
            assert requests == [report.resolve().as_uri()]
        finally:
            browser.close()


def report_of(run: Path, out: Path | None = None) -> Path:
    """report.html of ``run`` as `stepscope report` writes it (in-process: the same code)."""
    from stepscope.report.offline import write_html
    from stepscope.rundir.run import Run

    return write_html(Run.open(run), out)
