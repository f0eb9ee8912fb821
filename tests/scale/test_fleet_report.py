"""Ranks drawn as a fleet; read problems surfaced where report and diagnose show them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import orjson
from click.testing import CliRunner

from stepscope import RunDir, RunMeta
from stepscope.analysis.fleet import fleet_matrix, slowest_ranks
from stepscope.cli import _register, cli
from stepscope.schema import StepTable
from support.browser import embedded, offline_page, report_of
from support.rundirs import run_from_columns

STRAGGLER = 700


def _fleet(ranks: int = 1024, steps: int = 40) -> StepTable:
    rng = np.random.default_rng(0)
    rank = np.repeat(np.arange(ranks), steps)
    step = np.tile(np.arange(steps), ranks)
    st = 1.0 + rng.normal(0, 0.01, rank.size)
    st[rank == STRAGGLER] *= 1.3
    st[(rank == 5) & (step == 20)] = 4.0  # one slow step is not a slow rank
    return StepTable.from_columns({"rank": rank, "step": step, "step_time_s": st,
                                   "tokens": np.full(rank.size, 1000.0),
                                   "loss": np.tile(np.linspace(3, 2, steps), ranks)})


def test_matrix_is_the_mean_of_each_rank_in_each_step_bin() -> None:
    t = StepTable.from_columns({"rank": [0, 0, 0, 0, 1, 1], "step": [0, 1, 2, 3, 0, 3],
                                "step_time_s": [1.0, 3.0, 5.0, np.nan, 2.0, 4.0]})
    m = fleet_matrix(t, "step_time_s", max_bins=2)
    assert m.steps.tolist() == [0, 2]
    assert np.array_equal(m.values, [[2.0, 5.0], [2.0, 4.0]])


def test_slowest_rank_is_named_and_ranks_are_not_one_line_each(tmp_path: Path) -> None:
    t = _fleet()
    assert slowest_ranks(fleet_matrix(t, "step_time_s"), 1)[0][0] == STRAGGLER
    cols = {c: t[c] for c in ("rank", "step", "step_time_s", "tokens", "loss")}
    report = report_of(run_from_columns(tmp_path / "fleet", cols).path)
    assert report.stat().st_size < 3_000_000
    doc = embedded(report)
    fleet = doc["series"]["fleet"]
    assert fleet["ranks"] == 1024 and fleet["slowest"][0][0] == STRAGGLER
    assert 1.25 < fleet["slowest"][0][1] < 1.35
    assert len(doc["series"]["heatmap"]["ranks"]) == 1024  # every rank, as one raster
    # no per-rank lines: the fleet chart is bands, not 1,024 lines
    assert not any(k.startswith("ranks/") for k in doc["series"]["series"])
    with offline_page(report, "report-fleet-1024") as page:
        assert re.search(rf"rank {STRAGGLER} \(1\.3\dx\)", page.inner_text("#slowest"))
        assert page.evaluate("document.querySelector('#heat').height") == 1024
        assert "1008 more ranks" in page.inner_text("#per-rank")
        titles = page.eval_on_selector_all(".chart .title", "e => e.map(x => x.textContent)")
        i = titles.index("Step time across 1024 ranks")
        labels = page.evaluate(f"charts[{i}].series.map(s => s.label)")
        assert labels[1:] == ["fastest rank", "slowest rank", "10% of ranks", "90% of ranks",
                              "median of 1024 ranks"]


def _invoke(*args: str) -> tuple[int, str]:
    _register()
    res = CliRunner().invoke(cli, list(args))
    return res.exit_code, res.output


def test_report_and_diagnose_show_what_was_skipped_per_reason(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "run", RunMeta(run_id="bad"))
    lines = [orjson.dumps({"step": i, "step_time_s": 1.0, "tokens": 100.0}) for i in range(20)]
    lines[3] = b'{"step":3,"step_time_s":1.0,"tokens":"Infinity"}'
    lines.append(b'{"step":5,"step_time_s":9.0}')  # duplicate
    lines.append(b'{"step":true}')
    run.steps_path(0).write_bytes(b"\n".join(lines) + b"\n")
    raw = orjson.loads(run.meta_path.read_bytes())
    raw["environment"] = [1]
    run.meta_path.write_bytes(orjson.dumps(raw))
    code, out = _invoke("report", str(run.path), "--json", "--no-html")
    assert code == 0, out
    doc = json.loads(out)
    assert doc["read"]["reasons"] == {"tokens: not finite": 1, "duplicate (rank, step)": 1,
                                      "no integer step/rank": 1}
    assert doc["read"]["meta_problems"] == [
        "'environment' is a list, expected an object; dropped"]
    # The Infinity no longer poisons the headline (it read "nan"): 18 steady steps of 100
    # tokens over 19 s (the step whose count was dropped still took its time).
    assert doc["tokens_per_s"] == 1800 / 19
    code, out = _invoke("diagnose", str(run.path), "--json")
    assert code == 0 and json.loads(out)["read"]["skipped"] == 2
    code, out = _invoke("diagnose", str(run.path))
    assert code == 0 and "duplicate (rank, step) 1" in out
    code, out = _invoke("report", str(run.path), "--no-html")
    assert code == 0 and "2 skipped, 1 value(s) dropped" in out
