"""``_fastnp.nansum`` is ``float(np.nansum(x))`` to the bit: the column summed as it is when
nothing in it is NaN, nansum's own copy otherwise (and for any other shape or layout)."""

from __future__ import annotations

import numpy as np
import pytest

from stepscope._fastnp import nansum


@pytest.mark.parametrize("seed", range(30))
def test_nansum_equals_numpys_bit_for_bit(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 50_000))
    x = rng.gamma(2.0, 0.37, n) * rng.choice([1.0, -1.0], n)  # cancellation: order shows
    if seed % 3 == 1:
        x[rng.random(n) < 0.01] = np.nan
    if seed % 5 == 2:
        x[rng.random(n) < 0.001] = rng.choice([np.inf, -np.inf, -0.0])
    for v in (x, x[::3], x.astype(np.float32), x.reshape(-1, 1) if n else x,
              np.broadcast_to(np.float64(np.nan), (n,))):
        got, want = nansum(v), float(np.nansum(v))
        assert got == want or (got != got and want != want), (got, want)
        assert np.signbit(got) == np.signbit(want)
