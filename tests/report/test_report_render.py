"""Renderers show what the sheet holds: the per-rank table only for multi-rank runs, in the
terminal and in report.html as Chromium draws it."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from stepscope.analysis.summary import summarize
from stepscope.report.terminal import render_sheet
from stepscope.schema import RunMeta, StepTable
from support.browser import embedded, offline_page, report_of
from support.rundirs import run_from_columns

TWO = {"rank": [0, 0, 0, 1, 1, 1], "step": [0, 1, 2, 0, 1, 2],
       "step_time_s": [5.0, 1.0, 1.0, 5.0, 2.0, 2.0], "tokens": [100.0] * 6,
       "forward_s": [1.0, 0.5, 0.5, 1.0, 1.0, 1.0], "comm_s": [0.1] * 6}


def _text(table: StepTable) -> str:
    console = Console(record=True, width=100)
    render_sheet(console, summarize(table), RunMeta(run_id="r", status="finished"))
    return console.export_text()


def test_rank_table_for_multi_rank_runs_only(tmp_path: Path) -> None:
    two = StepTable.from_columns(TWO)
    text = _text(two)
    assert "Ranks (steady state), slowest first" in text and "comm total" in text
    rows = [ln.split() for ln in text.splitlines() if ln.strip("│ ").startswith(("0 ", "1 "))]
    assert [r[1] for r in rows] == ["1", "0"]  # slowest rank (2 s per step) listed first
    assert "[finished]" in text
    assert "Ranks (steady state)" not in _text(two.rank(0))

    report = report_of(run_from_columns(tmp_path / "two", TWO).path)
    assert [r["rank"] for r in embedded(report)["run"]["sheet"]["per_rank"]] == [0, 1]
    with offline_page(report, "report-two-ranks") as page:
        cells = page.eval_on_selector_all("#per-rank tr td:first-child",
                                          "tds => tds.map(td => td.textContent)")
        assert cells == ["1", "0"]  # slowest first, as in the terminal
    one = {k: v[:3] for k, v in TWO.items()}
    with offline_page(report_of(run_from_columns(tmp_path / "one", one).path)) as page:
        assert page.locator("#per-rank").count() == 0
        assert "One rank." in page.inner_text("#app")
