"""The offline HTML report: the dashboard's run page in one self-contained file.

The same page, script and chart library as ``stepscope serve``, inlined, with the run's two
documents (``run_doc``, ``series_doc``; series decimated by min/max envelopes) embedded as
JSON, so the report is interactive with no server and no network: a Content-Security-Policy
meta tag forbids every external load.

Example::

    path = write_html(stepscope.open_run("runs/exp1"))     # RUN/report.html
    html = render_offline(run_document, series_document)   # the page, from its documents
"""

from __future__ import annotations

import html as _html
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from ..rundir.run import REPORT_POINTS

if TYPE_CHECKING:
    from ..rundir.run import Run

__all__ = ["write_html", "render_offline", "embedded_data", "OFFLINE_CSP", "DATA_ID"]

DATA_ID = "stepscope-data"

# No source but the file itself: scripts and styles inline, images as data: URIs.
OFFLINE_CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
               "img-src data:; base-uri 'none'; form-action 'none'")


def _asset(name: str) -> str:
    return (resources.files("stepscope.report") / "assets" / name).read_text(encoding="utf-8")


def _inline_script(text: str) -> str:
    # A "</script" inside the code or the data would end the element early.
    return "<script>" + text.replace("</script", "<\\/script") + "</script>"


def write_html(run: Run, out: Path | None = None) -> Path:
    """Render the run's offline page and have the run directory write it (RUN/report.html,
    or ``out``); a page rendered from the same state of the run before is taken from its
    results store."""
    from .serve_data import run_doc

    name = run.path.name
    entry = run.stored("page", {"points": REPORT_POINTS, "name": name,
                                "flops_convention": run.flops_convention})
    page = entry.get()
    if not isinstance(page, str):
        page = render_offline(run_doc(name, run, run.findings()),
                              run.series(REPORT_POINTS))
        entry.put(page)
    return run.dir.write_report(page, out)


def render_offline(run: dict[str, Any], series: dict[str, Any]) -> str:
    """One HTML file holding the run page and its data (see the module docstring)."""
    page = _asset("dashboard.html")
    meta = run.get("meta") or {}
    title = _html.escape(f"stepscope — {meta.get('name') or meta.get('run_id') or 'run'}")
    page = page.replace("<title>stepscope</title>", f"<title>{title}</title>")
    data = orjson.dumps({"run": run, "series": series},
                        option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS,
                        default=str).decode()
    data = data.replace("<", "\\u003c")  # JSON stays valid; no markup can start inside it
    head = (f'<meta http-equiv="Content-Security-Policy" content="{OFFLINE_CSP}">'
            f"<style>{_asset('uPlot.min.css')}\n{_asset('dashboard.css')}</style>")
    page = page.replace('<link rel="stylesheet" href="/assets/uPlot.min.css">', head)
    page = page.replace('<link rel="stylesheet" href="/assets/dashboard.css">', "")
    page = page.replace('<script src="/assets/uPlot.iife.min.js"></script>',
                        _inline_script(_asset("uPlot.iife.min.js")))
    for name in ("charts.js", "views.js"):
        page = page.replace(f'<script src="/assets/{name}"></script>',
                            _inline_script(_asset(name)))
    # Data, not code: a JSON element the script parses (JSON.parse, no eval), which a
    # reader can also pull out of the file (``embedded_data``).
    page = page.replace('<script src="/assets/dashboard.js"></script>',
                        f'<script type="application/json" id="{DATA_ID}">{data}</script>'
                        + _inline_script(_asset("dashboard.js")))
    return page


def embedded_data(html: str) -> dict[str, Any]:
    """The ``{"run": ..., "series": ...}`` documents a report written here embeds."""
    start = html.find(f'id="{DATA_ID}">')
    if start < 0:
        raise ValueError("not a stepscope report: no embedded data element")
    start = html.index(">", start) + 1
    doc: dict[str, Any] = orjson.loads(html[start:html.index("</script>", start)])
    return doc
