"""The run page's layout at a fleet's scale, in a real Chromium: 1,024 ranks and billions of
tokens/s fit the page (no sideways overflow), tables name their slowest ranks and count the
rest, every y axis has room for its tick labels, which are distinct, and a step axis
shows whole steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stepscope import RunMeta
from support.browser import offline_page, report_of
from support.rundirs import run_from_columns

pytestmark = pytest.mark.slow
RANKS, STEPS = 1024, 30


@pytest.fixture(scope="module")
def fleet_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fleet") / "fleet-1024"
    n = RANKS * STEPS
    rank, step = np.repeat(np.arange(RANKS), STEPS), np.tile(np.arange(STEPS), RANKS)
    rng = np.random.default_rng(7)
    t = 0.5 + 0.02 * rng.standard_normal(n) + 0.2 * (rank % 97 == 3)  # 11 slow ranks
    run_from_columns(path, {
        "rank": rank, "step": step, "step_time_s": t, "end_s": 0.5 * (step + 1.0),
        "data_wait_s": np.full(n, 0.01), "forward_s": 0.3 * t, "backward_s": 0.6 * t,
        "tokens": np.full(n, 4.0e6), "samples": np.full(n, 1000.0),
        "loss": 8 * np.exp(-step / 10) + 2, "lr": np.full(n, 3e-4)},
        RunMeta(run_id="fleet-1024", status="finished",
                baseline={"num_devices": RANKS, "seq_len": 4096, "global_batch": 1000 * RANKS}))
    return report_of(path)


# For each chart: its y tick labels, whether they are distinct, and whether the widest fits
# the axis uPlot laid out (tick length + gap + the axis title's room + the text).
AXES = """charts.map((c) => {
  const a = c.axes[1], ctx = document.createElement('canvas').getContext('2d');
  ctx.font = a.font[0];
  const widest = Math.max(0, ...a._values.map((v) => ctx.measureText(v).width));
  return [c.series[1].label, a._values, new Set(a._values).size === a._values.length,
          a.ticks.size + a.gap + a.labelSize + widest <= a._size,
          [a.ticks.size, a.gap, a.labelSize, widest, a._size]];
})"""


@pytest.mark.parametrize("width", [1400, 1000])
def test_a_1024_rank_page_fits_and_its_axes_have_room(fleet_report: Path, width: int
                                                      ) -> None:
    with offline_page(fleet_report, f"report-1024-ranks-{width}px",
                      viewport=(width, 1000)) as page:
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        rows = page.eval_on_selector_all("#per-rank tr", "rs => rs.map(r => r.innerText)")
        assert len(rows) == 1 + 16 + 1  # header, the 16 slowest, the count of the rest
        assert "1008 more ranks" in rows[-1]
        assert rows[1].split()[0] in {str(r) for r in range(3, RANKS, 97)}  # a slow rank
        axes = {label: rest for label, *rest in page.evaluate(AXES)}
        for label, (values, distinct, fits, sizes) in axes.items():
            assert distinct and fits, (label, values, sizes)
        tokens = axes["Tokens/s"][0]
        assert tokens[-1].endswith("G") and max(len(v) for v in tokens) <= 5, tokens
        assert all("e-4" in v or v == "0" for v in axes["Learning rate"][0])
        steps = page.evaluate("charts.map((c) => c.axes[0]._values)")
        assert all(v.replace(",", "").isdigit() for vs in steps for v in vs), steps  # whole
