"""The straggler score of a rank: how fast it is against the typical rank (1.0 = as fast).

After NVIDIA's relative performance score (nvidia-resiliency-ext straggler usage guide: "0.5
means a rank is twice as slow as" the reference). One definition for the cross-rank view
recorded during training (``record.crossrank``), the health rules, ``diagnose`` and the trace
breakdown; the threshold that makes a rank a straggler is
``analysis.health.config.HealthConfig.straggler_score``, whose default is
:data:`STRAGGLER_SCORE`.

Example::

    straggler_scores({0: 0.50, 1: 0.52, 2: 0.80})   # {0: 1.04, 1: 1.0, 2: 0.65}
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping

__all__ = ["straggler_scores", "STRAGGLER_SCORE"]

# A rank scoring below 0.8 (>= 25% slower) is a straggler. Why 0.8, not NVIDIA's 0.7
# example threshold: a synchronous job runs at its slowest rank's pace, so a rank at score s
# costs the whole job 1 - s of its throughput, and 0.8 flags the same 20% loss as the
# health rules' throughput regression does over time.
STRAGGLER_SCORE = 0.8


def straggler_scores(rank_time_s: Mapping[int, float]) -> dict[int, float]:
    """Straggler score per rank: reference / the rank's median own-work time (1.0 = as fast).

    Reference: the lower median of the ranks' times (``statistics.median_low``): with two
    ranks the faster one (NVIDIA's best-rank reference), with many the typical rank, so
    one unusually fast rank (less data, a lighter pipeline stage) does not make every other
    rank a straggler. Ranks without a positive finite time get no score.
    """
    good = {r: float(v) for r, v in rank_time_s.items() if math.isfinite(v) and v > 0}
    if not good:
        return {}
    ref = statistics.median_low(good.values())
    return {r: ref / v for r, v in sorted(good.items())}
