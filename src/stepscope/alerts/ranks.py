"""The cross-rank live rule: a rank that is a straggler in consecutive gathers.

Reads the ``{"type": "cross_rank"}`` records rank 0's merge thread appends to events.jsonl
at each cross-rank exchange (stepscope/crossrank.py: the one straggler score and threshold
of ``HealthConfig``, after NVIDIA's straggler detector): every rank's score of one
exchange, the same scores each rank's step rows carry as ``straggler_score``. One slow
gather can be a checkpoint on one node; the same rank below the threshold in
``consecutive`` gathers in a row (the alert file's ``consecutive``, M) is a straggler.
Rank 0's in-process monitor and ``stepscope watch`` both run it. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..analysis.health.config import HealthConfig
from .model import Alert

_THRESHOLD = HealthConfig().straggler_score  # when an old event does not carry its own

__all__ = ["StragglerRule"]


class StragglerRule:
    """Fires once per episode per rank; re-arms when the rank is no longer flagged."""

    def __init__(self, run: str, consecutive: int) -> None:
        self.run = run
        self.consecutive = consecutive
        self._streak: dict[int, int] = {}

    def observe(self, event: Mapping[str, Any], now_s: float) -> list[Alert]:
        flagged = event.get("stragglers")
        if not isinstance(flagged, list):
            return []
        flagged_set = {r for r in flagged if isinstance(r, int)}
        for r in list(self._streak):
            if r not in flagged_set:
                del self._streak[r]
        scores = event.get("straggler_scores") or {}
        step = event.get("step") if isinstance(event.get("step"), int) else None
        out = []
        for r in sorted(flagged_set):
            self._streak[r] = self._streak.get(r, 0) + 1
            if self._streak[r] != self.consecutive:
                continue
            score = float(scores.get(str(r), float("nan")))
            threshold = float(event.get("threshold", _THRESHOLD))
            out.append(Alert(
                rule="straggler", severity="warning", run=self.run, rank=r, step=step,
                message=_message(event, r, score, threshold, self.consecutive),
                next_step="look at that rank's host: throttling, other jobs, a slow link "
                          "(`stepscope diagnose RUN` shows the per-rank line)",
                source="cross-rank straggler score (nvidia-resiliency-ext)",
                values={"score": score, "threshold": threshold},
                time_s=now_s))
        return out


def _message(event: Mapping[str, Any], rank: int, score: float, threshold: float,
             gathers: int) -> str:
    head = f"rank {rank} is a straggler in {gathers} gathers in a row"
    if not score > 0:
        return head
    head += f": score {score:.2f}, below {threshold:g}"
    on = str(event.get("score_on") or "")
    medians = event.get("medians")
    mine = medians.get(str(rank)) if isinstance(medians, Mapping) else None
    own = mine.get(on) if isinstance(mine, Mapping) else None
    if isinstance(own, (int, float)) and own > 0:
        # score = reference / own (crossrank.straggler_scores), so reference = score x own
        head += (f" ({on} {own:.3g} s per step against the reference rank's "
                 f"{score * own:.3g} s)")
    return head
