"""Per-rank loops as they were before vectorising (commit eed87b3): oracles for tests only.

``steady_mask``, ``throughput`` and ``rank_lines`` of analysis/summary.py and
``best_split`` of analysis/health/stats.py, verbatim but for names.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stepscope.analysis.summary import WARMUP_MAX_FRAC, WARMUP_SLOW_FACTOR
from stepscope.schema import StepTable

AnyArray = Any


def _rank_warmup(step_time: AnyArray) -> int:
    n = len(step_time)
    if n <= 2:
        return min(n - 1, 1) if n else 0
    cap = max(1, int(n * WARMUP_MAX_FRAC))
    k = 1
    rest = step_time[1:]
    finite = rest[np.isfinite(rest)]
    if not finite.size:
        return 1
    ref = float(np.median(finite))
    while k < cap and np.isfinite(step_time[k]) and step_time[k] > WARMUP_SLOW_FACTOR * ref:
        k += 1
    return k


def steady_mask(table: StepTable) -> AnyArray:
    """Boolean mask of steady-state rows (warm-up excluded per rank; see module doc)."""
    mask = np.zeros(len(table), dtype=bool)
    ranks = table["rank"]
    for r in np.unique(ranks):
        idx = np.flatnonzero(ranks == r)
        idx = idx[np.argsort(table["step"][idx], kind="stable")]
        k = _rank_warmup(table["step_time_s"][idx])
        mask[idx[k:]] = True
    return mask


def _share(table: StepTable, col: str, denom: float) -> float | None:
    if not table.has_data(col) or denom <= 0:
        return None
    return float(np.nansum(table[col]) / denom)


def _throughput(steady: StepTable, col: str) -> float | None:
    if not steady.has_data(col):
        return None
    total = 0.0
    for r in steady.ranks():
        part = steady.rank(r)
        t = float(np.nansum(part["step_time_s"]))
        if t > 0:
            total += float(np.nansum(part[col])) / t
    return total or None


def _rank_lines(steady: StepTable) -> list[dict[str, Any]]:
    """Per-rank medians and shares; compute = forward + backward (+ fused) + optimizer."""
    out = []
    for r in steady.ranks():
        part = steady.rank(r)
        st = part["step_time_s"][np.isfinite(part["step_time_s"])]
        total = float(st.sum()) if st.size else 0.0
        comp = [c for c in ("forward_s", "backward_s", "forward_backward_s", "optimizer_s")
                if part.has_data(c)]
        compute = (float(sum(np.nansum(part[c]) for c in comp)) / total
                   if comp and total > 0 else None)
        out.append(dict(
            rank=r, steps=len(part), step_time_s=float(np.median(st)) if st.size else None,
            tokens_per_s=_throughput(part, "tokens"),
            data_wait_frac=_share(part, "data_wait_s", total),
            comm_frac=_share(part, "comm_s", total), compute_frac=compute))
    return out


def best_split(y: AnyArray, min_segment: int, max_points: int = 400) -> int | None:
    """Index that best splits ``y`` into two segments of different medians.

    Minimises the summed absolute deviation from each segment's median (an L1 single
    changepoint, robust to outlier steps). Long series are first reduced to block medians
    of ``max_points`` blocks, so cost stays O(max_points^2). None if ``y`` is too short.
    """
    y = y[np.isfinite(y)]
    n = y.size
    if n < 2 * min_segment:
        return None
    block = max(1, int(np.ceil(n / max_points)))
    m = n // block
    pts = np.median(y[: m * block].reshape(m, block), axis=1) if block > 1 else y
    seg = max(1, min_segment // block)
    best, best_k = np.inf, None
    for k in range(seg, pts.size - seg + 1):
        left, right = pts[:k], pts[k:]
        cost = (np.abs(left - np.median(left)).sum() + np.abs(right - np.median(right)).sum())
        if cost < best:
            best, best_k = cost, k
    return None if best_k is None else best_k * block


