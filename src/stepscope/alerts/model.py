"""What an alert is: the rule that fired, how bad, where, the numbers, and what to do next.

An :class:`Alert` is plain data: the rules build it, the dispatcher routes it, the
platforms render it. Its ``key`` (rule and rank) is what de-duplication and the cool-down
group on, so the same rule firing again on the same rank is one story, not a flood.

Example::

    Alert(rule="step_time", severity="warning", run="exp1", rank=0, step=120,
          values={"step_time_s": 0.9, "median_s": 0.3}, message="step time 3.0x ...",
          next_step="run `stepscope diagnose RUN`", source="median rule")
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Alert", "Severity", "SEVERITIES", "severity_rank"]

Severity = Literal["info", "warning", "critical"]
# Ordered least to most severe: a sink's ``min_severity`` keeps this one and those after it.
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")
_RANK: dict[str, int] = {name: i for i, name in enumerate(SEVERITIES)}


def severity_rank(severity: str) -> int:
    """0 for info, 1 for warning, 2 for critical (unknown names count as critical)."""
    return _RANK.get(severity, len(SEVERITIES) - 1)


@dataclass(frozen=True)
class Alert:
    """One fired rule. ``values`` are the numbers that fired it, with units in their names."""

    rule: str
    severity: Severity
    run: str
    rank: int | None
    step: int | None
    message: str
    next_step: str
    source: str
    values: Mapping[str, float] = field(default_factory=dict)
    detail: str = ""  # long text (a Python stack); shown in full only where it fits
    time_s: float = 0.0  # UNIX time it fired, given by the caller (never read here)
    # Names the alert across its events.jsonl records (pending, then delivered); the
    # dispatcher gives one to an alert submitted without it.
    id: str = ""

    @property
    def key(self) -> str:
        """De-duplication key: the same rule on the same rank is the same alert."""
        return f"{self.rule}:{'all' if self.rank is None else self.rank}"

    def headline(self) -> str:
        """One line: severity, run, rank, step, rule and the message."""
        where = self.run or "run"
        if self.rank is not None:
            where += f" rank {self.rank}"
        if self.step is not None:
            where += f" step {self.step}"
        return f"[{self.severity.upper()}] {where}: {self.rule}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (non-finite values become strings, as the step files write them)."""
        vals: dict[str, Any] = {
            k: (v if isinstance(v, (int, float)) and math.isfinite(v) else str(v))
            for k, v in self.values.items()
        }
        return {
            "rule": self.rule, "severity": self.severity, "run": self.run, "rank": self.rank,
            "step": self.step, "message": self.message, "next_step": self.next_step,
            "source": self.source, "values": vals, "detail": self.detail,
            "time_s": self.time_s, "key": self.key, "id": self.id,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Alert:
        """The alert an events.jsonl record holds (the inverse of :meth:`to_dict`)."""
        def num(v: Any) -> float:
            try:
                return float(v)
            except (TypeError, ValueError):
                return math.nan
        sev = str(d.get("severity", "warning"))
        rank, step = d.get("rank"), d.get("step")
        values = d.get("values")
        return cls(
            rule=str(d.get("rule", "")),
            severity=sev if sev in SEVERITIES else "critical",
            run=str(d.get("run", "")), rank=rank if isinstance(rank, int) else None,
            step=step if isinstance(step, int) else None, message=str(d.get("message", "")),
            next_step=str(d.get("next_step", "")), source=str(d.get("source", "")),
            values={str(k): num(v) for k, v in values.items()} if isinstance(values, Mapping)
            else {}, detail=str(d.get("detail", "")), time_s=num(d.get("time_s", 0.0)),
            id=str(d.get("id", "")))
