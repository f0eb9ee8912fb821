"""Hand-computable checks of the fingerprint diff, both ledgers, scaling and the tables.

Step tables here are built from exact numbers (no clock), so every expected value below
can be worked out by hand from the comment beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from markdown_it import MarkdownIt

from stepscope.analysis.compare.quality import eval_record, quality_ledger
from stepscope.analysis.compare.runs import batch_trap, compare_runs, diff_fingerprints
from stepscope.analysis.compare.sample import step_sample
from stepscope.analysis.compare.scaling_efficiency import scaling
from stepscope.analysis.compare.speed import speed_ledger
from stepscope.analysis.summary import summarize
from stepscope.report.markdown_tables import comparison_markdown, md_table, scaling_markdown
from stepscope.schema import RunMeta, StepTable


def table(step_times: Sequence[float], tokens: float = 1000.0, rank: int = 0,
          loss: Sequence[float] | None = None, **cols: Any) -> StepTable:
    n = len(step_times)
    data: dict[str, Any] = {"rank": [rank] * n, "step": list(range(n)),
                            "step_time_s": list(step_times), "tokens": [tokens] * n}
    if loss is not None:
        data["loss"] = list(loss)
    data.update(cols)
    return StepTable.from_columns(data)


def meta(name: str = "a", **baseline: Any) -> RunMeta:
    return RunMeta(run_id=name, baseline=baseline)


# -- fingerprint ------------------------------------------------------------------------
def test_issue_example_is_two_variables_and_invalid() -> None:
    a = meta("a", global_batch=1024, num_devices=8, dp=8, lr=3e-4, seed=0)
    b = meta("b", global_batch=4096, num_devices=32, dp=32, lr=0.0003, seed=0.0)
    t = table([0.1] * 10)
    r = compare_runs(t, a, t, b, n_boot=50)
    assert [str(d) for d in r.differing] == ["num_devices 8\u219232", "dp 8\u219232",
                                             "global_batch 1024\u21924096"]
    assert [d.derived_from for d in r.differing] == [None, "num_devices", None]
    assert r.verdict == "invalid"
    assert r.reasons[0].startswith("2 variables differ: num_devices 8\u219232, "
                                   "global_batch 1024\u21924096")


def test_unrecorded_and_environment_differences_are_warnings() -> None:
    a = RunMeta(run_id="a", baseline={"seq_len": 256, "seed": 1},
                environment={"framework_version": "2.4.0", "hostname": "n1"})
    b = RunMeta(run_id="b", baseline={"seq_len": 256},
                environment={"framework_version": "2.5.0", "hostname": "n1"})
    differing, env = diff_fingerprints(a, b)
    assert differing == []
    assert [(d.variable, d.a, d.b) for d in env] == [("seed", 1, None),
                                                     ("framework_version", "2.4.0", "2.5.0")]
    assert env[0].warning == ("baseline variable seed recorded only in run A; cannot confirm "
                              "it is unchanged")


def test_batch_trap() -> None:
    a = {"global_batch": 1024, "lr": 3e-4, "warmup_steps": 100}
    assert batch_trap(a, {**a, "global_batch": 4096}) == (
        "global batch raised 1024\u21924096 (4x) with lr not scaled, warmup_steps not scaled:"
        " the loss curve flattens; scale the LR (e.g. linearly, Goyal et al. 2017) or "
        "lengthen warm-up")
    assert batch_trap(a, {**a, "global_batch": 4096, "lr": 1.2e-3}) is None
    assert batch_trap(a, {**a, "global_batch": 4096, "warmup_steps": 400}) is None
    assert batch_trap(a, {**a, "global_batch": 512}) is None
    assert "lr not recorded" in (batch_trap({"global_batch": 8}, {"global_batch": 16}) or "")


# -- speed ledger -------------------------------------------------------------------------
def test_exact_speedup() -> None:
    # Step 0 is warm-up (1 s); then A takes 0.1 s and B 0.05 s per 1000-token step.
    ta = table([1.0] + [0.1] * 19)
    tb = table([1.0] + [0.05] * 19)
    s = speed_ledger(ta, None, tb, None, seed=0, n_boot=200)
    tps = s.metrics["tokens_per_s"]
    assert (tps.a, tps.b) == pytest.approx((10_000.0, 20_000.0))
    assert tps.diff_rel == pytest.approx(1.0)
    assert tps.ci_rel == pytest.approx((1.0, 1.0))
    assert tps.noise_rel == pytest.approx(0.01)  # no spread, no drift: the 1% floor
    assert (tps.change, s.verdict, s.primary) == ("better", "faster", "tokens_per_s")
    assert s.metrics["step_time_s"].change == "better"
    assert s.excluded == {"warmup_rows": (1, 1), "outlier_steps": (0, 0)}


def test_difference_below_the_noise_floor_is_not_a_gain() -> None:
    # 0.5% faster on every step: the interval excludes zero, but 0.5% < the 1% floor.
    s = speed_ledger(table([1.0] + [0.1] * 19), None, table([1.0] + [0.0995] * 19), None,
                     n_boot=200)
    tps = s.metrics["tokens_per_s"]
    assert tps.ci_rel is not None and tps.ci_rel[0] > 0
    assert (tps.change, s.verdict) == ("no significant difference",
                                       "no significant difference")


def test_difference_below_step_spread_is_not_a_gain() -> None:
    # After a 1 s warm-up step, steps alternate 0.08 / 0.12 s: median 0.1, MAD 0.02, so
    # the robust spread is 1.4826 x 0.02 / 0.1 = 29.65%; both halves have the same median
    # (no drift). A 5% faster B is well inside that spread.
    a = np.array([1.0] + [0.08, 0.12] * 30)
    s = speed_ledger(table(a), None, table(a * 0.95), None, n_boot=300)
    assert s.metrics["step_time_s"].noise_rel == pytest.approx(1.4826 * 0.2, rel=1e-4)
    assert s.metrics["step_time_s"].diff_rel == pytest.approx(-0.05)
    assert s.verdict == "no significant difference"


def test_outliers_are_excluded_and_counted() -> None:
    # 0.10/0.11 alternating, one 1.0 s stall at step 10. Steady steps: 8 x 0.10, 10 x 0.11
    # and the stall; median 0.11, MAD 0, so the mean absolute deviation stands in:
    # (8 x 0.01 + 0.89) / 19 = 0.0511, z = 0.89 / (1.2533 x 0.0511) = 13.9 > 3.5.
    times = [0.10, 0.11] * 10
    times[10] = 1.0
    s = speed_ledger(table(times), None, table(times), None, n_boot=100)
    assert s.excluded["outlier_steps"] == (1, 1)
    assert s.steps_used == (18, 18)  # 20 - 1 warm-up - 1 outlier
    assert s.metrics["step_time_s"].a == pytest.approx(0.11)


def test_point_values_match_summarize_for_two_ranks() -> None:
    # rank 0: 0.1 s, rank 1: 0.2 s per 1000 tokens -> 10000 + 5000 tokens/s.
    t = StepTable.concat([table([0.5] + [0.1] * 9, rank=0, comm_exposed_s=[0.01] * 10),
                          table([0.5] + [0.2] * 9, rank=1, comm_exposed_s=[0.03] * 10)])
    m = RunMeta(run_id="x", baseline={"num_devices": 2},
                environment={"flops_per_token": 6e6, "peak_flops_per_device": 1e12})
    s = speed_ledger(t, m, t, m, n_boot=100)
    sheet = summarize(t, m)
    assert s.metrics["tokens_per_s"].a == pytest.approx(sheet.tokens_per_s) == 15_000
    assert s.metrics["mfu"].a == pytest.approx(sheet.mfu) == pytest.approx(0.045)
    # (9 x 0.01 + 9 x 0.03) / (9 x 0.1 + 9 x 0.2)
    assert s.metrics["comm_exposed_frac"].a == pytest.approx(0.04 / 0.3)
    assert s.metrics["tokens_per_s"].change == "no significant difference"


# -- quality ledger -----------------------------------------------------------------------
def test_loss_matched_on_tokens() -> None:
    # A: 100 tokens/step, 10 steps (1000 tokens); B: 200 tokens/step, 5 steps.
    # Window = last 10% of 1000 tokens = [900, 1000]: A steps 8, 9; B step 4.
    ta = table([0.1] * 10, tokens=100, loss=[3.0] * 8 + [2.0, 2.2])
    tb = table([0.1] * 5, tokens=200, loss=[3.0] * 4 + [2.5])
    q = quality_ledger(ta, tb)
    m = q.metrics["train_loss"]
    assert (m.a, m.b, m.at) == (pytest.approx(2.1), 2.5, {"tokens": 1000.0})
    assert m.diff == pytest.approx(0.4)
    # standard error of A's window mean: std([2.0, 2.2], ddof=1)/sqrt(2) = 0.1; B has 1 record
    assert m.tolerance == pytest.approx(0.2)
    assert (m.verdict, q.verdict) == ("regressed", "regressed")


def test_evals_direction_and_unknown() -> None:
    ea = [eval_record(100, {"val_loss": 2.0, "bleu": 30.0}), eval_record(200, {"wer": 0.2})]
    eb = [eval_record(100, {"val_loss": 2.005, "bleu": 29.0}), eval_record(300, {"wer": 0.1})]
    t = table([0.1] * 3)
    q = quality_ledger(t, t, ea, eb)
    got = {k: m.verdict for k, m in q.metrics.items()}
    # val_loss +0.25% is inside the 0.5% tolerance; bleu -1 is worse (higher is better);
    # wer was evaluated at different steps: unknown.
    assert got == {"train_loss": "unknown", "eval:bleu": "regressed",
                   "eval:val_loss": "holds", "eval:wer": "unknown"}
    assert q.verdict == "regressed"
    assert quality_ledger(t, t).verdict == "unknown"
    with pytest.raises(ValueError):
        eval_record(1, {"val_loss": float("nan")})


# -- scaling and tables ---------------------------------------------------------------------
def test_scaling_efficiency() -> None:
    # 8 devices: 8000 tokens/s = 1000 per device; 16 devices: 14400 = 900 per device.
    r8 = ("8", table([0.5] + [1.0] * 9, tokens=8000), meta("8", num_devices=8,
                                                            global_batch=64, seed=0))
    r16 = ("16", table([0.5] + [1.0] * 9, tokens=14400),
           meta("16", num_devices=16, global_batch=128, seed=1))
    r = scaling([r16, r8])
    assert [(p.name, p.throughput_per_device, p.efficiency) for p in r.points] == [
        ("8", pytest.approx(1000.0), pytest.approx(1.0)),
        ("16", pytest.approx(900.0), pytest.approx(0.9))]
    assert r.mode == "weak" and r.unit == "tokens/s"
    assert [str(d) for d in r.differing] == ["seed 0\u21921"]
    assert _gfm_cells(scaling_markdown(r))[0] == [
        "run", "devices", "tokens/s", "tokens/s per device", "efficiency", "comm share", "MFU"]


def _gfm_cells(text: str) -> list[list[str]]:
    """Parse with a real GFM table parser; returns header + body rows as cell text."""
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    assert tokens[0].type == "table_open", text
    rows: list[list[str]] = []
    in_cell = False
    for tok in tokens:
        if tok.type == "tr_open":
            rows.append([])
        elif tok.type in ("th_open", "td_open", "th_close", "td_close"):
            in_cell = tok.type.endswith("open")
        elif tok.type == "inline" and in_cell:
            rows[-1].append(tok.content)
    assert sum(t.type == "table_close" for t in tokens) == 1
    return rows


def test_markdown_tables_are_valid_gfm() -> None:
    assert _gfm_cells(md_table(["a", "b"], [["x|y", "line\nbreak"], [1]])) == [
        ["a", "b"], ["x|y", "line break"], ["1", ""]]
    t = table([1.0] + [0.1] * 9)
    r = compare_runs(t, meta("base", lr=1e-3), t, meta("new|one", lr=2e-3), n_boot=50)
    text = comparison_markdown(r)
    assert _gfm_cells(text) == [
        ["config", "step time (s)", "comm share", "tokens/s", "MFU"],
        ["base (lr=0.001)", "0.1", "n/a", "10,000", "n/a"],
        ["new|one (lr=0.002)", "0.1", "n/a", "10,000", "n/a"]]
    assert text.endswith("**not landed** — speed: no significant difference, quality: "
                         "unknown\n")


def test_long_many_rank_runs_use_blocks_and_stay_exact_at_the_point() -> None:
    # 3000 steps x 20 ranks = 60,000 rows: blocked (1000 blocks of 3 steps) and thinned
    # for the median bootstrap; the point values are still the exact ones.
    rng = np.random.default_rng(3)
    n, ranks = 3000, 20
    base = 0.1 * (1 + 0.05 * rng.standard_normal((ranks, n)))
    ta = StepTable.concat([table(base[r], rank=r) for r in range(ranks)])
    tb = StepTable.concat([table(base[r] * 0.9, rank=r) for r in range(ranks)])
    s = speed_ledger(ta, None, tb, None, n_boot=300)
    st = s.metrics["step_time_s"]
    kept = step_sample(ta)  # steady rows minus outlier steps, unthinned
    assert kept.rows_sorted.size > 50_000
    assert st.a == float(np.median(kept.rows_sorted))
    assert st.diff_rel == pytest.approx(-0.1)
    assert st.ci_rel is not None and st.ci_rel[0] < -0.1 < st.ci_rel[1]
    assert (st.change, s.verdict) == ("better", "faster")


def test_cli_scaling(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import itertools

    import orjson

    import stepscope
    from stepscope.cli import main

    # 8 devices: 8000 tokens per 1 s step; 32 devices: 28800 per 1 s -> 90% efficiency.
    for devices, tokens in ((8, 8000.0), (32, 28800.0)):
        ticks = itertools.count()
        with stepscope.Recorder(tmp_path / f"d{devices}", rank=0, background=False,
                                clock=lambda t=ticks: float(next(t)),
                                meta={"baseline": {"num_devices": devices,
                                                   "global_batch": 8 * devices}}) as rec:
            for _ in range(6):
                with rec.step(tokens=tokens, samples=8 * devices):
                    pass
    with pytest.raises(SystemExit) as exc:
        main(["scaling", str(tmp_path / "d32"), str(tmp_path / "d8"), "--json"])
    doc = orjson.loads(capsys.readouterr().out)
    assert exc.value.code == 0
    assert [(p["name"], p["num_devices"], p["efficiency"]) for p in doc["points"]] == [
        ("d8", 8, 1.0), ("d32", 32, pytest.approx(0.9))]
    assert (doc["mode"], doc["differing"]) == ("weak", [])


def test_baseline_repeat_measures_run_to_run_noise() -> None:
    # B is 5% faster than A on every step; a repeat of A's configuration came in 6% faster
    # than A, so 5% is within measured run-to-run noise.
    a, a2, b = (table([1.0] + [t] * 19) for t in (0.1, 0.1 / 1.06, 0.1 / 1.05))
    alone = speed_ledger(a, None, b, None, n_boot=100)
    assert alone.verdict == "faster"
    with_repeat = speed_ledger(a, None, b, None, n_boot=100, baseline_repeats=[(a2, None)])
    assert with_repeat.metrics["tokens_per_s"].noise_rel == pytest.approx(0.06)
    assert with_repeat.verdict == "no significant difference"


def test_loss_matched_on_steps_without_tokens_and_scaling_view() -> None:
    from rich.console import Console

    from stepscope.report.compare_view import render_scaling

    nan = float("nan")
    ta = table([0.1] * 10, tokens=nan, loss=[1.0] * 10)
    tb = table([0.1] * 20, tokens=nan, loss=[0.9] * 20)
    m = quality_ledger(ta, tb).metrics["train_loss"]
    # window = last 10% of step 9 = steps 8.1..9 -> step 9 only in both runs
    assert (m.at, m.a, m.b, m.verdict) == ({"step": 9.0}, 1.0, 0.9, "holds")
    r = scaling([("one", table([0.5] + [1.0] * 5, tokens=100.0), meta("1", num_devices=1)),
                 ("two", table([0.5] + [1.0] * 5, tokens=150.0), meta("2", num_devices=2))])
    console = Console(width=100, record=True)
    render_scaling(console, r)
    text = console.export_text()
    assert "Scaling (unknown)" in text and "75.0%" in text and "100.0%" in text
