"""The health-check sheet of a run, as ``report`` and ``demo`` load, print and save it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..analysis.diagnose import diagnose, records_lost
from ..analysis.findings import Finding, severity_rank
from ..analysis.flopsconv import with_flops_convention
from ..analysis.summary import Sheet, summarize
from ..report.offline import render_offline
from ..report.serve_data import run_doc, series_doc
from ..schema import RunMeta, StepTable
from ..store import ReadStats, RunDir
from .common import load_steps, note_event_problems

__all__ = ["LoadedRun", "load_run", "write_html", "sheet_json"]


@dataclass
class LoadedRun:
    run: RunDir
    meta: RunMeta
    table: StepTable
    stats: ReadStats
    sheet: Sheet
    findings: list[Finding]
    events: list[dict[str, Any]]


def load_run(path: str | Path, flops_convention: str | None = None) -> LoadedRun:
    """Open, read and analyse a run directory (raises StepscopeError on bad input);
    ``flops_convention``: MFU under that convention, as the run recorded it."""
    rs = load_steps(path)
    meta = with_flops_convention(rs.meta, flops_convention) if flops_convention else rs.meta
    events, ev_stats = rs.run.read_events()
    note_event_problems(ev_stats)
    conditions = rs.run.read_conditions()
    sheet = summarize(rs.table, meta, skipped_records=rs.stats.skipped,
                      conditions=conditions)
    result = diagnose(rs.table, meta, events=events, conditions=conditions)
    findings = sorted(result.findings, key=lambda f: severity_rank(f.severity))
    return LoadedRun(rs.run, meta, rs.table, rs.stats, sheet, findings, events)


# Points per chart series embedded in report.html (min/max envelopes past it): a chart is
# ~500-1,400 px wide, so 4,000 keeps every pixel's extremes and the file a few MB at most.
REPORT_POINTS = 4000


def write_html(loaded: LoadedRun, out: Path | None = None) -> Path:
    """Render the offline run page (report/offline.py) and have the store write it
    (RUN/report.html, or ``out``)."""
    name = loaded.run.path.name
    doc = run_doc(name, loaded.run, loaded.table, loaded.meta, loaded.sheet,
                  loaded.stats.problems, loaded.findings, loaded.stats)
    series = series_doc(name, loaded.table, loaded.sheet, loaded.meta,
                        max_points=REPORT_POINTS)
    return loaded.run.write_report(render_offline(doc, series), out)


def sheet_json(loaded: LoadedRun) -> dict[str, Any]:
    d = loaded.sheet.to_dict()
    d["run"] = {"path": str(loaded.run.path), "run_id": loaded.meta.run_id,
                "name": loaded.meta.name, "status": loaded.meta.status,
                "error": loaded.meta.error}
    d["findings"] = [f.to_dict() for f in loaded.findings]
    d["read_problems"] = loaded.stats.problems
    d["read"] = {**loaded.stats.to_dict(), "meta_problems": loaded.run.meta_problems}
    d["records_lost"], d["write_error"] = records_lost(loaded.meta, loaded.events)
    return d
