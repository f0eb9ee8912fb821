"""Numbers from step records and a rolling median: what every live rule reads with.

Example::

    record_value({"loss": "NaN"}, "loss")     # nan: the step files write NaN as a string
    m = RollingMedian(3); [m.push(v) for v in (1.0, 5.0, 2.0, 9.0)]; m.median()   # 5.0
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Mapping
from typing import Any

__all__ = ["RollingMedian", "record_value"]

_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def record_value(record: Mapping[str, Any], key: str) -> float | None:
    """A number from a step record: None if not recorded; NaN/inf if the training made one."""
    v = record.get(key)
    if isinstance(v, str):
        return _NONFINITE.get(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return None


class RollingMedian:
    """Median of the last ``size`` values pushed (a sorted copy beside a FIFO)."""

    def __init__(self, size: int) -> None:
        self._fifo: deque[float] = deque()
        self._sorted: list[float] = []
        self._size = size

    def __len__(self) -> int:
        return len(self._fifo)

    def push(self, v: float) -> None:
        self._fifo.append(v)
        bisect.insort(self._sorted, v)
        if len(self._fifo) > self._size:
            old = self._fifo.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]

    def median(self) -> float:
        s, n = self._sorted, len(self._sorted)
        return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])

    def mad(self) -> float:
        """Median absolute deviation (for the robust z of the loss-spike rule)."""
        m = self.median()
        dev = sorted(abs(v - m) for v in self._sorted)
        n = len(dev)
        return dev[n // 2] if n % 2 else 0.5 * (dev[n // 2 - 1] + dev[n // 2])
