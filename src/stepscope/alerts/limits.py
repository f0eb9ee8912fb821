"""Rate limits and cool-downs, with the clock passed in (tests use exact numbers).

A platform's limit is "at most N messages in any window of W seconds" (WeCom: 20 per
minute), so the limiter keeps the send times of the last N messages rather than a token
bucket: a bucket of 20 refilling one per 3 s lets through 20 + 20 = 40 messages in some
60-second window, which the robot would refuse. Messages are also spaced by at least W/N
(3 s for 20 per minute): a storm then leaves as one folded summary every few seconds, not
as twenty messages in the first second.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

__all__ = ["WindowLimiter", "CoolDown"]


class WindowLimiter:
    """At most ``n`` events in any window of ``w`` seconds, for every (n, w) given, and
    consecutive events at least max(w / n) apart."""

    def __init__(self, windows: Sequence[tuple[int, float]]) -> None:
        self._windows = tuple((n, w) for n, w in windows if n > 0 and w > 0)
        self._gap_s = max((w / n for n, w in self._windows), default=0.0)
        keep = max((n for n, _ in self._windows), default=0)
        self._times: deque[float] = deque(maxlen=keep or None)

    def next_free(self, now: float) -> float:
        """Earliest time >= ``now`` at which one more event stays within every window."""
        t = now
        times = self._times
        if times:
            t = max(t, times[-1] + self._gap_s)
        for n, w in self._windows:
            if len(times) >= n:
                t = max(t, times[-n] + w)
        return t

    def record(self, now: float) -> None:
        if self._windows:
            self._times.append(now)


class CoolDown:
    """True the first time a key is seen, then False until ``cooldown_s`` has passed."""

    def __init__(self, cooldown_s: float, max_keys: int = 10_000) -> None:
        self._cooldown_s = cooldown_s
        self._last: dict[str, float] = {}
        self._max_keys = max_keys

    def admit(self, key: str, now: float) -> bool:
        last = self._last.get(key)
        if last is not None and now - last < self._cooldown_s:
            return False
        if len(self._last) >= self._max_keys:  # bounded memory on a run with many ranks
            self._last = {k: v for k, v in self._last.items() if now - v < self._cooldown_s}
        self._last[key] = now
        return True
