"""Cross-rank view: per-rank step-time medians -> straggler scores. Framework-free.

Adapters gather one small vector per rank every ``every`` steps with their framework's own
collective (``mindspore.ops.AllGather``, ``torch.distributed.all_gather``) and hand the
gathered numbers here.

Score (after NVIDIA's straggler detector, nvidia-resiliency-ext ``straggler``: a score is
reference performance / rank performance, 1.0 = as fast as the reference): for each rank,
``reference median / rank median`` of its compute time per step, where the reference is the
median over ranks of the per-rank medians (NVIDIA takes the best rank; the median is less
sensitive to one unusually fast rank). A rank scoring below ``STRAGGLER_THRESHOLD`` is a
straggler.

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

__all__ = ["STRAGGLER_THRESHOLD", "straggler_scores", "stragglers", "WindowStats",
           "cross_rank_event"]

# Megatron-Bridge's NVRxStragglerDetectionConfig default ``gpu_relative_perf_threshold``.
STRAGGLER_THRESHOLD = 0.7


def straggler_scores(rank_medians: Mapping[int, float]) -> dict[int, float]:
    """reference median / rank median for each rank with a positive finite median."""
    good = {r: float(v) for r, v in rank_medians.items() if math.isfinite(v) and v > 0}
    if not good:
        return {}
    ref = float(np.median(list(good.values())))
    return {r: ref / v for r, v in sorted(good.items())}


def stragglers(scores: Mapping[int, float], threshold: float = STRAGGLER_THRESHOLD
               ) -> list[int]:
    return sorted(r for r, s in scores.items() if s < threshold)


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
