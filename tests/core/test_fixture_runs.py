"""The committed run-directory fixtures (tests/data/, made by stepscope's own runs) read back
exactly: every value equals what a plain line-by-line JSON parse of the same file holds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from stepscope import RunDir

DATA = Path(__file__).resolve().parents[1] / "data"


def _plain_rows(path: Path) -> list[dict[str, object]]:
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # the torn line
    return rows


def _assert_table_equals_files(run: Path) -> int:
    table, _ = RunDir.open(run).read_steps()
    expected = [r for f in sorted((run / "steps").glob("rank-*.jsonl")) for r in _plain_rows(f)]
    assert len(table) == len(expected)
    for i, row in enumerate(sorted(expected, key=lambda r: (r["rank"], r["step"]))):
        for key, value in row.items():
            if isinstance(value, (int, float)) and key in table:
                got = float(table[key][i])
                assert got == float(value) or (math.isnan(got) and math.isnan(float(value))), \
                    (i, key, got, value)
    return len(expected)


def test_torn_last_line_is_skipped_and_counted_and_the_rest_is_exact() -> None:
    run = DATA / "run-torn-last-line"
    table, stats = RunDir.open(run).read_steps()
    assert table["step"].tolist() == list(range(7))
    assert (stats.records, stats.torn_tail, stats.skipped) == (7, 1, 1)
    assert _assert_table_equals_files(run) == 7


def test_two_rank_ddp_run_keeps_each_ranks_rows_and_comm() -> None:
    run = DATA / "run-ddp-two-ranks"
    table, stats = RunDir.open(run).read_steps()
    assert stats.skipped == 0
    for rank in (0, 1):
        mine = table.rank(rank)
        assert mine["step"].tolist() == list(range(6))
        assert (mine["comm_s"] > 0).all()
    assert _assert_table_equals_files(run) == 12


@pytest.mark.parametrize("name", ["run-torn-last-line", "run-ddp-two-ranks"])
def test_fixture_run_json_names_the_command_that_made_it(name: str) -> None:
    meta = RunDir.open(DATA / name).read_meta()
    note = (DATA / name / "NOTE.md").read_text()
    assert meta.command and meta.command[-1] in note
