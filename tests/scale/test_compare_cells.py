"""Compare's step x rank matrices (``sample._Cells``) equal the scatter they replace: each
row's value written at (step, rank), non-finite as 0, the last row's value where a cell is
given twice, on full grids in the store's order and on tables that are none."""

from __future__ import annotations

import numpy as np
import pytest

from stepscope._fastnp import unique_ints
from stepscope.analysis.compare.sample import _Cells


def _scatter(vals: np.ndarray, step_pos: np.ndarray, rank_pos: np.ndarray,
             shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The matrices as compare built them before (the oracle)."""
    out = np.zeros(shape)
    out[step_pos, rank_pos] = np.where(np.isfinite(vals), vals, 0.0)
    present = np.zeros(shape, dtype=bool)
    present[step_pos, rank_pos] = True
    return out, present


def _rows(rng: np.random.Generator, case: str) -> tuple[np.ndarray, np.ndarray]:
    ranks, steps = int(rng.integers(1, 40)), int(rng.integers(1, 300))
    rank = np.repeat(np.arange(ranks) * 2 + 3, steps)  # sparse rank ids, as a subset has
    step = np.tile(np.arange(steps) * 5 + 10, ranks)
    if case == "grid":
        return rank, step
    if case == "missing":  # rows lost, order kept
        keep = rng.random(rank.size) > 0.3
        return rank[keep], step[keep]
    if case == "shuffled":
        order = rng.permutation(rank.size)
        return rank[order], step[order]
    # repeated cells: some rows again, later in the table
    again = rng.integers(0, rank.size, max(1, rank.size // 10))
    return np.concatenate([rank, rank[again]]), np.concatenate([step, step[again]])


@pytest.mark.parametrize("case", ["grid", "missing", "shuffled", "repeated"])
@pytest.mark.parametrize("seed", range(12))
def test_cells_equal_the_scatter_into_steps_by_ranks(case: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    rank, step = _rows(rng, case)
    steps, step_pos = unique_ints(step, return_inverse=True)
    ranks, rank_pos = unique_ints(rank, return_inverse=True)
    shape = (len(steps), len(ranks))
    cells = _Cells(step_pos, rank_pos, shape)
    assert (cells.flat is None) == (case == "grid")  # a full grid in order: no scatter
    for _ in range(3):
        vals = rng.normal(size=rank.size)
        vals[rng.random(rank.size) < 0.05] = rng.choice([np.nan, np.inf, -np.inf])
        want, present = _scatter(vals, step_pos, rank_pos, shape)
        got = cells.matrix(vals)
        assert got.flags.c_contiguous and got.shape == shape
        np.testing.assert_array_equal(got, want)
        assert np.array_equal(np.signbit(got), np.signbit(want))
        np.testing.assert_array_equal(cells.present(), present)


def test_no_rows_make_empty_matrices() -> None:
    empty = np.zeros(0, dtype=np.int64)
    cells = _Cells(empty, empty, (0, 0))
    assert cells.matrix(np.zeros(0)).shape == (0, 0)
    assert cells.present().shape == (0, 0)
