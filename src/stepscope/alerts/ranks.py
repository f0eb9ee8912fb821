"""The cross-rank live rule: a rank that is a straggler in consecutive gathers.

Reads the ``{"type": "cross_rank"}`` records the adapters append to events.jsonl at each
cross-rank exchange (stepscope/crossrank.py: the one straggler score and threshold of
``HealthConfig``, after NVIDIA's straggler detector). One slow gather can be a checkpoint
on one node; the same rank slow in ``consecutive`` gathers in a row is a straggler. Pure.
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

    def __init__(self, run: str, consecutive: int = 2) -> None:
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
            out.append(Alert(
                rule="straggler", severity="warning", run=self.run, rank=r, step=step,
                message=f"rank {r} is a straggler in {self.consecutive} gathers in a row "
                        f"(score {score:.2f}: the median rank is {1 / score:.2f}x faster)"
                        if score > 0 else f"rank {r} is a straggler",
                next_step="look at that rank's host: throttling, other jobs, a slow link "
                          "(`stepscope diagnose RUN` shows the per-rank line)",
                source="cross-rank straggler score (nvidia-resiliency-ext), issue 14",
                values={"score": score, "threshold": float(event.get("threshold", _THRESHOLD))},
                time_s=now_s))
        return out
