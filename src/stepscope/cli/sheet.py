"""The health-check sheet of a run, as ``report`` and ``demo`` load, print and save it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..analysis.diagnose import diagnose, records_lost
from ..analysis.findings import Finding, severity_rank
from ..analysis.flopsconv import with_flops_convention
from ..analysis.profile_split import wants_profile, with_profile_split
from ..analysis.summary import Sheet, summarize
from ..report.html import render_html
from ..report.profile_view import profile_html
from ..report.serve_data import latest_profile
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
    profile: dict[str, Any] | None = None  # the latest profile's analysis, if any


def _profile_doc(run: RunDir) -> dict[str, Any] | None:
    """The latest archived profile's analysis: the one written beside it (``stepscope run``
    with torch), else its trace read now (MindSpore captures are never analysed in the
    training process). None without a profile; a status when it cannot be read."""
    doc = latest_profile(run)
    if doc is None or isinstance(doc.get("report"), dict):
        return doc
    from ..analysis.trace.breakdown import analyze  # heavy: only when a profile exists
    from ..errors import StepscopeError
    from ..traces import read_trace

    d = run.profile_dirs()[-1]
    try:
        doc["report"] = analyze(read_trace(d)).to_dict()
        doc["status"] = "analysed when the report was made"
    except (StepscopeError, OSError, ValueError) as exc:
        doc["status"] = f"not analysed ({type(exc).__name__}: {exc})"
    return doc


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
    # Reading an unanalysed capture costs a trace read: only when the breakdown needs it.
    profile = _profile_doc(rs.run) if wants_profile(sheet) else latest_profile(rs.run)
    sheet = with_profile_split(sheet, profile)
    result = diagnose(rs.table, meta, events=events, conditions=conditions)
    findings = sorted(result.findings, key=lambda f: severity_rank(f.severity))
    return LoadedRun(rs.run, meta, rs.table, rs.stats, sheet, findings, events, profile)


def write_html(loaded: LoadedRun, out: Path | None = None,
               sections: tuple[tuple[str, str], ...] = ()) -> Path:
    """Render the report and have the store write it (RUN/report.html, or ``out``)."""
    profile = profile_html(loaded.profile if loaded.profile is not None
                           else latest_profile(loaded.run))
    if profile:
        sections = (*sections, ("Latest profile", profile))
    text = render_html(loaded.sheet, loaded.meta, loaded.table, loaded.findings, sections)
    return loaded.run.write_report(text, out)


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
