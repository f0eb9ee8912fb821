"""Rank screens of the per-rank rules in ``system``: the ranks a rule could flag, all at once.

``rule_throughput`` and ``rule_memory`` judge one rank's series at a time (a regression
split, a creep trend): at 1,024 ranks that was 1,024 calls each, nearly all of which found
nothing. Each rule's first test is cheap and rejects a quiet rank outright: the quarter
medians (and, for throughput, the bounds of any split's medians). A screen takes those
tests for every rank at once, when every rank has as many rows as the others and its
series is whole (then a column is a (ranks x steps) matrix, and ``np.median`` and
``np.partition`` along its rows take the same values as on each rank's own array). The
rule then judges only the ranks the screen keeps, so it finds what it found over every rank.

A rank the screen cannot judge that way (a NaN, a zero or negative rate, a rank of another
length) is kept, and a tolerance of 1e-9 keeps a rank within rounding of a threshold: a
screen may keep too many, never too few.

Example::

    for r in throughput_suspects(t, cfg):   # instead of t.ranks()
        ...
"""

from __future__ import annotations

import numpy as np

from ...schema import AnyArray, StepTable
from .config import HealthConfig
from .stats import by_rank

__all__ = ["throughput_suspects", "creep_suspects"]

_TOL = 1e-9
# Rows of the matrices taken at a time: a 9.6-million-row table is 77 MB a column, and the
# rates, their test and the partition would each copy one.
_CELLS_PER_CHUNK = 1 << 21


def _rows(table: StepTable, *cols: str) -> tuple[AnyArray, list[AnyArray]] | None:
    """(ranks, columns as ranks x steps matrices in step order, views) when every rank has
    the same number of rows; None otherwise."""
    ranks, bounds, got = by_rank(table, *cols)
    lens = np.diff(bounds)
    if not ranks.size or not lens[0] or not (lens == lens[0]).all():
        return None
    n = int(lens[0])
    return ranks, [np.asarray(c, dtype=np.float64).reshape(ranks.size, n) for c in got]


def _chunks(rows: int, n: int) -> list[slice]:
    step = max(1, _CELLS_PER_CHUNK // max(1, n))
    return [slice(a, a + step) for a in range(0, rows, step)]


def _quarters(m: AnyArray) -> tuple[AnyArray, AnyArray]:
    """``stats.quarter_medians`` of each row (every value finite)."""
    q = max(1, m.shape[1] // 4)
    return np.median(m[:, :q], axis=1), np.median(m[:, -q:], axis=1)


def _kept(ranks: AnyArray, could: AnyArray) -> list[int]:
    return [int(r) for r in ranks[could]]


def throughput_suspects(t: StepTable, cfg: HealthConfig) -> list[int]:
    """The ranks ``system._rank_throughput`` could flag: those whose quarter medians or
    split-median bounds reach ``regression_drop``, and those this cannot tell."""
    got = _rows(t, "step_time_s", "tokens")
    if got is None:
        return t.ranks()
    ranks, (st, tok) = got
    n = st.shape[1]
    seg = max(cfg.regression_min_segment, n // 10)
    block = max(1, int(np.ceil(n / 400)))  # ``stats.split_medians_bound``, row by row
    j = (max(1, seg // block) * block - 1) // 2
    drop = cfg.regression_drop - _TOL
    could = np.ones(ranks.size, dtype=bool)
    for rows in _chunks(ranks.size, n):
        s, k = st[rows], tok[rows]
        with np.errstate(divide="ignore", invalid="ignore"):
            # ``system._rate``: tokens/s where every token count of the rank is finite
            rate = np.where(np.isfinite(k).all(axis=1)[:, None], k / s, 1.0 / s)
            whole = (np.isfinite(rate) & (rate > 0)).all(axis=1)
        if n < cfg.regression_min_steps:  # too short: no whole rank can be flagged
            could[rows] = ~whole
            continue
        m = rate[whole]
        q0, q1 = _quarters(m)
        flag = 1 - q1 / q0 >= drop
        if n >= 2 * seg:
            part = np.partition(m, (j, n - 1 - j), axis=1)
            flag |= 1 - part[:, j] / part[:, n - 1 - j] >= drop
        sub = could[rows]
        sub[whole] = flag
    return _kept(ranks, could)


def creep_suspects(t: StepTable, cfg: HealthConfig) -> list[int]:
    """The ranks ``system.memory_creep`` could flag: those whose peak grows from the first
    to the last quarter's median by both creep thresholds, and those this cannot tell."""
    got = _rows(t, "mem_peak_bytes")
    if got is None:
        return t.ranks()
    ranks, (peak,) = got
    n = peak.shape[1]
    could = np.ones(ranks.size, dtype=bool)
    for rows in _chunks(ranks.size, n):
        whole = np.isfinite(peak[rows]).all(axis=1)
        if n < cfg.min_steps:
            could[rows] = ~whole
            continue
        first, last = _quarters(peak[rows][whole])
        growth = last - first
        slack = _TOL * np.abs(first)
        sub = could[rows]
        sub[whole] = ((growth >= cfg.mem_creep_min_bytes * (1 - _TOL) - slack)
                      & (growth >= cfg.mem_creep_frac * first - slack))
    return _kept(ranks, could)
