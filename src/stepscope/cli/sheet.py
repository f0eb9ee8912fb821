"""The health-check sheet of a run, as ``report`` and ``demo`` load, print and save it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..analysis.diagnose import diagnose, health_findings, records_lost
from ..analysis.flopsconv import with_flops_convention
from ..analysis.profile_split import wants_profile, with_profile_split
from ..analysis.summary import Sheet, summarize
from ..findings import Finding, severity_rank
from ..proc import forked as _forked
from ..proc.forked import Forked
from ..report.offline import render_offline
from ..report.serve_data import latest_profile, run_doc, series_doc
from ..rundir.results import Stored
from ..rundir.store import ReadStats, RunDir
from ..schema import RunMeta, StepTable
from .common import load_steps, note_event_problems

__all__ = ["LoadedRun", "load_run", "write_html", "sheet_json"]


@dataclass
class LoadedRun:
    run: RunDir
    meta: RunMeta
    stats: ReadStats
    sheet: Sheet
    findings: list[Finding]
    events: list[dict[str, Any]]
    profile: dict[str, Any] | None = None  # the latest profile's analysis, if any
    # The step table: None when the sheet came from the run's summary store (read on use).
    table_: StepTable | None = None
    stored: Stored | None = None  # the store entry of this state of the run, if any
    series_: dict[str, Any] | None = None  # the HTML page's charts, when made with the sheet

    @property
    def table(self) -> StepTable:
        if self.table_ is None:
            self.table_ = self.run.read_steps()[0]
        return self.table_


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


def load_run(path: str | Path, flops_convention: str | None = None, *,
             fork: bool = False, html: bool = False) -> LoadedRun:
    """Open, read and analyse a run directory (raises StepscopeError on bad input);
    ``flops_convention``: MFU under that convention, as the run recorded it.

    The sheet, findings and read counts of a run whose files are unchanged since they were
    last computed come from its summary store (``_summary_store``); the table is then read
    only when used. ``fork`` (stepscope's own one-shot commands only): the health rules
    run in a forked child (``_forked``) while this process summarizes, for tables of the
    size where that pays (``_forked.worth_it``). ``html``: the HTML page will be written,
    so its charts are made too, while the child finishes."""
    run = RunDir.open(path)
    entry = Stored([run.path], "report", {"flops_convention": flops_convention})
    doc = entry.get()
    if doc is not None:
        meta = run.read_meta()
        meta = with_flops_convention(meta, flops_convention) if flops_convention else meta
        events, ev_stats = run.read_events()
        note_event_problems(ev_stats)
        return LoadedRun(run, meta, ReadStats.from_dict(doc["stats"]),
                         Sheet.from_dict(doc["sheet"]),
                         [Finding.from_dict(f) for f in doc["findings"]], events,
                         doc["profile"], stored=entry)
    rs = load_steps(run.path)
    meta = with_flops_convention(rs.meta, flops_convention) if flops_convention else rs.meta
    events, ev_stats = rs.run.read_events()
    note_event_problems(ev_stats)
    conditions = rs.run.read_conditions()
    # The health rules need nothing of the sheet: on two CPUs they run in a child while
    # this process summarizes (a cold report of a 1,024-rank run spent ~1.5 s on the two
    # one after the other); the rest of diagnose reuses what summarize found (regimes).
    with Forked(health_findings, rs.table, meta, events,
                fork=fork and _forked.worth_it(len(rs.table))) as job:
        sheet = summarize(rs.table, meta, skipped_records=rs.stats.skipped,
                          conditions=conditions)
        # Reading an unanalysed capture costs a trace read: only when the breakdown needs it.
        profile = _profile_doc(rs.run) if wants_profile(sheet) else latest_profile(rs.run)
        sheet = with_profile_split(sheet, profile)
        series = (series_doc(run.path.name, rs.table, sheet, meta, max_points=REPORT_POINTS)
                  if html else None)
        health = job.result()
    result = diagnose(rs.table, meta, events=events, conditions=conditions, health=health)
    findings = sorted(result.findings, key=lambda f: severity_rank(f.severity))
    stored = entry if entry.put({"stats": rs.stats.to_dict(), "sheet": sheet.to_dict(),
                                 "findings": [f.to_dict() for f in findings],
                                 "profile": profile}) else None
    return LoadedRun(rs.run, meta, rs.stats, sheet, findings, events, profile, rs.table,
                     stored, series)


# Points per chart series embedded in report.html (min/max envelopes past it): a chart is
# ~500-1,400 px wide, so 4,000 keeps every pixel's extremes and the file a few MB at most.
REPORT_POINTS = 4000


def write_html(loaded: LoadedRun, out: Path | None = None) -> Path:
    """Render the offline run page (report/offline.py) and have the store write it
    (RUN/report.html, or ``out``); a page rendered from the same state of the run before
    is taken from the run's summary store."""
    name = loaded.run.path.name
    page = None
    entry = None
    if loaded.stored is not None:
        entry = Stored([loaded.run.path], "page",
                       {"of": loaded.stored.key, "points": REPORT_POINTS, "name": name})
        page = entry.get()
    if not isinstance(page, str):
        doc = run_doc(name, loaded.run, loaded.table, loaded.meta, loaded.sheet,
                      loaded.stats.problems, loaded.findings, loaded.stats)
        if loaded.profile is not None:  # a capture analysed on demand for the breakdown
            doc["profile"] = loaded.profile
        series = loaded.series_ if loaded.series_ is not None else series_doc(
            name, loaded.table, loaded.sheet, loaded.meta, max_points=REPORT_POINTS)
        page = render_offline(doc, series)
        if entry is not None:
            entry.put(page)
    return loaded.run.write_report(page, out)


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
