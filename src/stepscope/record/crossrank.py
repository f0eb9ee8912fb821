"""Cross-rank view: per-rank step-time medians -> straggler scores. Framework-free.

Every ``every`` steps each rank publishes one small vector (its window medians) through
:class:`FileExchange`, a side channel in the run directory that is *not* the training's
process group: a collective of stepscope's, keyed on each rank's own step count, deadlocked
jobs whose ranks run different step counts (``model.join()``, an early ``break``) when one
rank waited in the gather while another waited in the script's own collective.

Score and threshold: stepscope's one straggler definition,
:func:`stepscope.calc.straggler.straggler_scores` and
``HealthConfig.straggler_score`` (after NVIDIA's relative performance score; see there for
the reference rank and why 0.8), applied here to each rank's median compute time per step.
``diagnose`` and the health rule judge the same scores with the same threshold.

Example::

    scores = straggler_scores({0: 0.50, 1: 0.52, 2: 0.80})
    # {0: 1.04, 1: 1.0, 2: 0.65}; stragglers(scores) -> [2]
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from ..calc.straggler import STRAGGLER_SCORE, straggler_scores

__all__ = ["STRAGGLER_THRESHOLD", "straggler_scores", "stragglers", "WindowStats",
           "cross_rank_event", "FileExchange", "Rows"]

# Rank -> that rank's vector (a missing rank has no entry).
Rows = Mapping[int, Sequence[float]]

# The health rules' threshold, recorded in each event (HealthConfig.straggler_score's
# default).
STRAGGLER_THRESHOLD = STRAGGLER_SCORE


def stragglers(scores: Mapping[int, float], threshold: float = STRAGGLER_THRESHOLD
               ) -> list[int]:
    """Ranks scoring below ``threshold`` (as ``HealthConfig.stragglers`` counts them)."""
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


def as_rows(gathered: Rows | Sequence[Sequence[float]]) -> dict[int, list[float]]:
    """{rank: vector} from a mapping, or from a list indexed by rank."""
    items = gathered.items() if isinstance(gathered, Mapping) else enumerate(gathered)
    return {int(r): [float(v) for v in row] for r, row in items}


def cross_rank_event(step: int, names: Sequence[str],
                     gathered: Rows | Sequence[Sequence[float]],
                     score_on: str) -> dict[str, Any]:
    """The ``events.jsonl`` record of one exchange: per-rank medians, scores, stragglers.

    ``gathered[r]`` is rank r's ``WindowStats.medians()`` (a mapping may lack ranks);
    ``score_on`` names the quantity scored (compute time: step time without data wait
    and communication).
    """
    per_rank = {r: dict(zip(names, row[:len(names)], strict=True))
                for r, row in sorted(as_rows(gathered).items())}
    scores = straggler_scores({r: v[score_on] for r, v in per_rank.items()})
    return {
        "type": "cross_rank", "step": int(step), "ranks": len(per_rank),
        "medians": {str(r): v for r, v in per_rank.items()},
        "score_on": score_on,
        "straggler_scores": {str(r): s for r, s in scores.items()},
        "stragglers": stragglers(scores), "threshold": STRAGGLER_THRESHOLD,
    }


class ExchangeStore(Protocol):
    """What :class:`FileExchange` needs of the run directory (``store.RunDir`` has it)."""

    def publish_rank_window(self, rank: int, payload: Mapping[str, Any]) -> bool: ...

    def rank_windows(self) -> dict[int, dict[str, Any]]: ...

    def publish_cross_view(self, event: Mapping[str, Any]) -> bool: ...

    def cross_view(self) -> dict[str, Any] | None: ...

    def append_event(self, event: Mapping[str, Any]) -> None: ...


EventBuilder = Callable[[int, Rows], dict[str, Any]]
# How long rank 0's merge thread waits for the peers to publish the same step: DDP ranks
# run in lockstep, so they publish within milliseconds; a rank that is seconds away is
# uneven (join, early stop) or gone, and is then compared at its latest window.
SETTLE_S = 2.0
_SETTLE_POLL_S = 0.05


class FileExchange:
    """Cross-rank view through the run directory: no collective, nothing waits on a peer.

    ``exchange(step, vector)`` (training thread, every N steps) writes this rank's vector
    to its own file (one small atomic replace; the previous one is kept in it) and
    returns the latest merged view (the ``cross_rank`` event rank 0 published last, or
    None). On rank 0 it also hands ``step`` to its merge thread (a newer step replaces
    one not yet begun): for up to ``settle_s`` it waits (on its own thread, never the training's)
    for every rank to publish that step, then uses each rank's window of that step, else
    its latest if within ``max_lag_steps`` (the view is then not ``aligned`` and the
    ``aligned_only`` fields, comparisons of one step across ranks, are dropped), else
    names the rank in ``stale_ranks``: a rank far behind, ahead or gone is reported,
    never waited for. The event from ``event(step, rows)`` is appended to events.jsonl
    and published as the view; with fewer than two usable ranks the view says why.
    """

    def __init__(self, store: ExchangeStore, rank: int, world: int, event: EventBuilder,
                 max_lag_steps: int, aligned_only: Sequence[str] = (),
                 settle_s: float = SETTLE_S,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.store, self.rank, self.world = store, int(rank), int(world)
        self.event, self.max_lag = event, int(max_lag_steps)
        self.aligned_only = tuple(aligned_only)
        self.settle_s = float(settle_s)
        self.wall = wall_clock
        self._last: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._next: int | None = None  # the step rank 0's merge thread does next
        self._merging: threading.Thread | None = None

    def __call__(self, step: int, vector: Sequence[float]) -> dict[str, Any] | None:
        entry = {"step": int(step), "wall_time_s": self.wall(),
                 "values": [float(v) for v in vector]}
        self.store.publish_rank_window(self.rank, {"rank": self.rank, **entry,
                                                   "previous": self._last})
        self._last = entry
        if self.rank == 0:
            with self._lock:  # a merge still running takes this step next (latest wins)
                self._next = int(step)
                if self._merging is None or not self._merging.is_alive():
                    self._merging = threading.Thread(target=self._merge_loop, daemon=True,
                                                     name="stepscope-crossrank")
                    self._merging.start()
        return self.store.cross_view()

    def join(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) for the merges under way, e.g. before the process exits."""
        thread = self._merging
        if thread is not None:
            thread.join(timeout_s)

    def _merge_loop(self) -> None:
        while True:
            with self._lock:
                step, self._next = self._next, None
                if step is None:
                    self._merging = None
                    return
            try:
                self.merge(step)
            except Exception as exc:  # never let a bad file end the thread noisily
                self.store.append_event({"type": "warning", "rank": self.rank,
                                         "message": f"cross-rank view skipped: {exc}"})

    def _pick(self, payload: Mapping[str, Any], step: int, exact: bool = False
              ) -> tuple[int, list[float]] | None:
        """(step, values) of the entry for ``step``, else (unless ``exact``) the latest
        within the lag."""
        entries = [payload, payload.get("previous")]
        good = [(e["step"], e["values"]) for e in entries if isinstance(e, Mapping)
                and isinstance(e.get("step"), int) and isinstance(e.get("values"), list)]
        for at, values in good:
            if at == step:
                return at, _floats(values)
        if not exact and good and abs(good[0][0] - step) <= self.max_lag:
            return good[0][0], _floats(good[0][1])
        return None

    def _settled(self, step: int) -> dict[int, dict[str, Any]]:
        """The ranks' files once all have published ``step`` (or ``settle_s`` passed)."""
        end = time.monotonic() + self.settle_s
        while True:
            windows = self.store.rank_windows()
            have = {r for r, p in windows.items() if self._pick(p, step, exact=True)}
            if len(have) >= self.world or time.monotonic() >= end:
                return windows
            time.sleep(_SETTLE_POLL_S)

    def merge(self, step: int) -> dict[str, Any]:
        """Build, append and publish the view of ``step`` from the ranks' files."""
        rows: dict[int, list[float]] = {}
        steps: dict[int, int] = {}
        stale: list[int] = []
        for r, payload in self._settled(step).items():
            if not 0 <= r < self.world:
                continue
            picked = self._pick(payload, step)
            if picked is None:
                stale.append(r)
            else:
                steps[r], rows[r] = picked
        missing = sorted(set(range(self.world)) - set(rows) - set(stale))
        if len(rows) < 2:
            view = {"type": "cross_rank", "step": step, "skipped":
                    f"{len(rows)} rank(s) within {self.max_lag} steps of step {step}",
                    "stale_ranks": sorted(stale), "missing_ranks": missing}
            self.store.publish_cross_view(view)
            return view
        event = self.event(step, rows)
        event["aligned"] = all(at == step for at in steps.values())
        if not event["aligned"]:
            for key in self.aligned_only:
                event.pop(key, None)
        event.update(stale_ranks=sorted(stale), missing_ranks=missing,
                     rank_steps={str(r): at for r, at in sorted(steps.items())})
        self.store.append_event(event)
        self.store.publish_cross_view(event)
        return event


def _floats(values: list[Any]) -> list[float]:
    return [float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
            for v in values]
