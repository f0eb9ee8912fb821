"""Cross-rank view: per-rank step-time medians -> straggler scores. Framework-free.

Adapters gather one small vector per rank every ``every`` steps with their framework's own
collective (``mindspore.ops.AllGather``, ``torch.distributed.all_gather``) and hand the
gathered numbers here.

Score and threshold: stepscope's one straggler definition,
:func:`stepscope.analysis.health.config.straggler_scores` and
``HealthConfig.straggler_score`` (after NVIDIA's relative performance score; see there for
the reference rank and why 0.8), applied here to each rank's median compute time per step.
``diagnose`` and the health rule judge the same scores with the same threshold.

Example::

    scores = straggler_scores({0: 0.50, 1: 0.52, 2: 0.80})
    # {0: 1.04, 1: 1.0, 2: 0.65}; stragglers(scores) -> [2]
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...analysis.health.config import HealthConfig, straggler_scores

__all__ = ["STRAGGLER_THRESHOLD", "straggler_scores", "stragglers", "WindowStats",
           "cross_rank_event"]

# The health rules' threshold, recorded in each event (HealthConfig.straggler_score).
STRAGGLER_THRESHOLD = HealthConfig.straggler_score


def stragglers(scores: Mapping[int, float], threshold: float = STRAGGLER_THRESHOLD
               ) -> list[int]:
    """Ranks scoring below ``threshold`` (:meth:`HealthConfig.stragglers`)."""
    return HealthConfig(straggler_score=threshold).stragglers(scores)


class WindowStats:
    """The last ``window`` steps' values of a few named quantities; medians on demand."""

    def __init__(self, names: Sequence[str], window: int = 50) -> None:
        self.names = tuple(names)
        self._values = {n: deque[float](maxlen=window) for n in self.names}

    def add(self, **values: float) -> None:
        for n in self.names:
            v = values.get(n, math.nan)
            if math.isfinite(v):
                self._values[n].append(v)

    def medians(self) -> list[float]:
        return [float(np.median(self._values[n])) if self._values[n] else math.nan
                for n in self.names]


def cross_rank_event(step: int, names: Sequence[str], gathered: Sequence[Sequence[float]],
                     score_on: str) -> dict[str, Any]:
    """The ``events.jsonl`` record of one gather: per-rank medians, scores, stragglers.

    ``gathered[r]`` is rank r's ``WindowStats.medians()``; ``score_on`` names the quantity
    scored (compute time, i.e. step time without data wait and communication).
    """
    per_rank = {r: dict(zip(names, map(float, row), strict=True))
                for r, row in enumerate(gathered)}
    scores = straggler_scores({r: v[score_on] for r, v in per_rank.items()})
    return {
        "type": "cross_rank", "step": int(step), "ranks": len(gathered),
        "medians": {str(r): v for r, v in per_rank.items()},
        "score_on": score_on,
        "straggler_scores": {str(r): s for r, s in scores.items()},
        "stragglers": stragglers(scores), "threshold": STRAGGLER_THRESHOLD,
    }
