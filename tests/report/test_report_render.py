"""Renderers show what the sheet holds: the per-rank table only for multi-rank runs."""

from __future__ import annotations

from rich.console import Console

from stepscope.analysis.summary import summarize
from stepscope.report.html import render_html
from stepscope.report.terminal import render_sheet
from stepscope.schema import RunMeta, StepTable


def _sheet_text(table: StepTable) -> tuple[str, str]:
    sheet = summarize(table)
    meta = RunMeta(run_id="r", status="finished")
    console = Console(record=True, width=100)
    render_sheet(console, sheet, meta)
    return console.export_text(), render_html(sheet, meta, table)


def test_rank_table_for_multi_rank_runs_only() -> None:
    two = StepTable.from_columns({
        "rank": [0, 0, 0, 1, 1, 1], "step": [0, 1, 2, 0, 1, 2],
        "step_time_s": [5.0, 1.0, 1.0, 5.0, 2.0, 2.0], "tokens": [100.0] * 6,
        "forward_s": [1.0, 0.5, 0.5, 1.0, 1.0, 1.0], "comm_s": [0.1] * 6})
    text, html = _sheet_text(two)
    assert "Ranks (steady state), slowest first" in text and "comm total" in text
    rows = [ln.split() for ln in text.splitlines() if ln.strip("│ ").startswith(("0 ", "1 "))]
    assert [r[1] for r in rows] == ["1", "0"]  # slowest rank (2 s per step) listed first
    assert "Ranks (steady state)" in html and "[finished]" in text
    one = two.rank(0)
    text, html = _sheet_text(one)
    assert "Ranks (steady state)" not in text and "Ranks (steady state)" not in html
