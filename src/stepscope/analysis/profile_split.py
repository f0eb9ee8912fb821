"""The report's phase breakdown from an archived profile, where the step records have none.

``Model.train`` runs forward, backward and update as one call (one compiled graph), so its
step records hold only the data wait and the report said "other 99.9%". When the run has
an archived profile, its trace splits the profiled steps into phases; this module turns a
trace report (``TraceReport.to_dict()``) into the sheet's ``phase_frac`` and says so in
``phase_source``.

Shares are of the summed step time over every profiled rank-step (trace phases: ``data`` ->
``data_wait``, ``other`` and ``idle`` -> ``other``; the rest keep their names). The
recorded split is kept when it already names at least ``RECORDED_ENOUGH`` of the step.

Example::

    sheet = with_profile_split(sheet, latest_profile_doc)
    sheet.phase_source   # 'profile 20261201T120000Z: 3 profiled steps on 1 rank ...'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from .summary import Sheet

__all__ = ["profile_phase_split", "with_profile_split", "wants_profile", "RECORDED_ENOUGH"]

# Below this share named by the records (forward/backward/optimizer/comm...), the profile
# tells more: a stepscope choice (the field report's Model.train run named 0.1%).
RECORDED_ENOUGH = 0.5
_TRACE_TO_SHEET = {"data": "data_wait", "forward": "forward", "backward": "backward",
                   "comm_exposed": "comm_exposed", "optimizer": "optimizer",
                   "other": "other", "idle": "other"}


def profile_phase_split(report: Mapping[str, Any]) -> tuple[dict[str, float], int, int] | None:
    """(phase shares, profiled rank-steps, ranks) of a trace report; None without steps."""
    totals = dict.fromkeys(dict.fromkeys(_TRACE_TO_SHEET.values()), 0.0)
    step_us, n, ranks = 0.0, 0, 0
    for row in (report.get("ranks") or {}).values():
        steps = [s for s in (row.get("steps") or []) if isinstance(s, Mapping)] \
            if isinstance(row, Mapping) else []
        ranks += bool(steps)
        for s in steps:
            t = float(s.get("step_time_us") or 0.0)
            if not t > 0:
                continue
            n += 1
            step_us += t
            for phase, key in _TRACE_TO_SHEET.items():
                totals[key] += float(s.get(f"{phase}_us") or 0.0)
    if not n:
        return None
    return {k: v / step_us for k, v in totals.items() if v > 0 or k == "other"}, n, ranks


def _named(sheet: Sheet) -> float:
    return sum(v for k, v in sheet.phase_frac.items() if k not in ("data_wait", "other"))


def wants_profile(sheet: Sheet) -> bool:
    """True when the records name too little of the step (a profile would be used)."""
    return bool(sheet.steps) and _named(sheet) < RECORDED_ENOUGH


def with_profile_split(sheet: Sheet, doc: Mapping[str, Any] | None) -> Sheet:
    """``sheet`` with the profile's phase split when the records name too little of the
    step (see the module doc); ``doc``: ``latest_profile``'s document (``report``,
    ``profile_dir``)."""
    if not doc or not isinstance(doc.get("report"), Mapping):
        return sheet
    named = _named(sheet)
    if named >= RECORDED_ENOUGH:
        return sheet
    split = profile_phase_split(doc["report"])
    if split is None:
        return sheet
    frac, n, ranks = split
    source = (f"profile {doc.get('profile_dir', '')}: {n} profiled steps on {ranks} "
              f"rank{'s' if ranks != 1 else ''} (the step records name "
              f"{named:.0%} of the step; profiled steps carry the profiler's overhead)")
    return replace(sheet, phase_frac=frac, phase_source=source)
