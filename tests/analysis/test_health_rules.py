"""Health rules on hand-built step tables: every number below is computable by hand.

Tables are built with exact values (no randomness) so results are compared whole.
Step 0 is always slow (1.0 s) so warm-up exclusion has something to exclude.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from stepscope.analysis.health.check import RULES, HealthConfig, check_health
from stepscope.analysis.health.numerics import nonfinite_index
from stepscope.analysis.health.stats import (
    best_split,
    robust_sigma,
    runs_of,
    spearman,
    trailing_robust_z,
)
from stepscope.analysis.health.training import lr_restarts
from stepscope.findings import Finding
from stepscope.schema import RunMeta, StepTable

N = 100


def _base(n: int = N, **cols: object) -> StepTable:
    """A healthy single-rank run: 0.1 s steps (step 0: 1.0 s warm-up), 1000 tokens, loss
    falling smoothly from 3 to ~1 with a +-0.02 zig-zag, constant LR and grad norm."""
    steps = np.arange(n)
    st = np.full(n, 0.1)
    st[0] = 1.0
    zig = np.where(steps % 2 == 0, 0.02, -0.02)
    data: dict[str, object] = {
        "rank": np.zeros(n, dtype=np.int64), "step": steps, "step_time_s": st,
        "end_s": np.cumsum(st), "tokens": np.full(n, 1000.0),
        "loss": 1.0 + 2.0 * np.exp(-steps / 30) + zig, "lr": np.full(n, 1e-3),
        "grad_norm": 1.0 + 0.1 * zig, "data_wait_s": np.full(n, 0.001),
    }
    data.update(cols)
    return StepTable.from_columns(data)  # type: ignore[arg-type]


def _summary(findings: list[Finding]) -> list[tuple[str, str, tuple[int, int] | None, int | None]]:
    return [(f.category, f.severity, f.steps, f.rank) for f in findings]


def test_healthy_table_has_no_findings() -> None:
    assert check_health(_base(), RunMeta("r", baseline={"lr": 1e-3})) == []


def test_empty_table_has_no_findings() -> None:
    assert check_health(StepTable.empty()) == []


def test_nan_loss_from_step_60_is_critical_numerics_at_60() -> None:
    t = _base()
    loss, gn = t["loss"].copy(), t["grad_norm"].copy()
    loss[60:] = np.nan  # the store writes NaN as missing: a gap in an every-step column
    gn[60:] = np.nan
    (f,) = check_health(_base(loss=loss, grad_norm=gn))
    assert _summary([f]) == [("numerics", "critical", (60, 99), 0)]
    assert f.evidence["first_nonfinite_step"] == 60 and f.evidence["nonfinite_steps"] == 40
    assert f.confidence == 0.9  # loss and grad norm missing together


def test_explicit_inf_is_non_finite_and_sparse_logging_is_not() -> None:
    v = np.array([1.0, 1.0, np.inf, 1.0])
    assert nonfinite_index(v, np.arange(4)).tolist() == [2]
    sparse = np.full(40, np.nan)
    sparse[::10] = 1.0  # logged every 10 steps: gaps are cadence, not NaN
    assert nonfinite_index(sparse, np.arange(40)).tolist() == []
    last_only = np.array([1.0, 1.0, 1.0, np.nan])  # one lost trailing record
    assert nonfinite_index(last_only, np.arange(4)).tolist() == []


def test_single_loss_spike_is_reported_with_step_and_size() -> None:
    loss = _base()["loss"].copy()
    loss[70] = 10.0
    (f,) = check_health(_base(loss=loss))
    assert _summary([f]) == [("loss_spike", "warning", (70, 70), 0)]
    assert f.evidence["step"] == 70 and f.evidence["loss"] == 10.0
    assert f.evidence["ratio"] > 5


def test_sustained_spike_is_critical() -> None:
    loss = _base()["loss"].copy()
    loss[70:78] = 10.0  # 8 steps >= 2x the trailing mean (LLM-Foundry: > 4 steps)
    spikes = [f for f in check_health(_base(loss=loss)) if f.category == "loss_spike"]
    assert _summary(spikes) == [("loss_spike", "critical", (70, 77), 0)]


def test_overflow_skips_are_numerics_not_nan() -> None:
    gn = _base()["grad_norm"].copy()
    ovf = np.zeros(N)
    ovf[[30, 31, 50]] = 1
    gn[[30, 31, 50]] = np.nan  # inf grad norm on skipped steps, written as missing
    found = check_health(_base(grad_norm=gn, overflow=ovf))
    assert _summary(found) == [("numerics", "info", (30, 50), 0)]
    assert found[0].evidence["overflow_steps"] == 3
    assert found[0].message.startswith(f"3 of {N} updates skipped")


def test_every_update_skipped_in_a_short_run_is_critical() -> None:
    """10 steps, all overflowed: nothing was trained."""
    t = StepTable.from_columns({"step": np.arange(10), "rank": np.zeros(10, np.int64),
                                "step_time_s": np.full(10, 0.1), "overflow": np.ones(10),
                                "loss_scale": 2.0 ** (26 - np.arange(10))})
    found = [f for f in check_health(t) if f.rule in ("health.overflow", "health.loss_scale")]
    assert [(f.severity, f.message.split(":")[0]) for f in found
            if f.rule == "health.overflow"] == [("critical", "0 of 10 updates applied")]
    assert not any("no upper bound" in f.message for f in found)  # it only fell


def test_grad_norm_jumps_at_loss_scale_backoffs_say_scale_oscillates() -> None:
    gn = np.ones(N)
    scale = np.full(N, 2.0**16)
    for s in (30, 50, 70, 90):
        gn[s] = 100.0
        scale[s:] /= 2  # a backoff at each jump
    found = [f for f in check_health(_base(grad_norm=gn, loss_scale=scale))
             if f.category == "grad_norm"]
    assert _summary(found) == [("grad_norm", "warning", (30, 90), 0)]
    assert "loss scale is oscillating" in found[0].message
    assert found[0].evidence["at_loss_scale_backoff"] == 4


def test_grad_norm_sustained_growth_and_vanishing() -> None:
    grow = np.geomspace(1.0, 1000.0, N)
    (f,) = [f for f in check_health(_base(grad_norm=grow)) if f.category == "grad_norm"]
    assert "explosion" in f.message
    vanish = np.geomspace(1.0, 1e-6, N)
    (f,) = [f for f in check_health(_base(grad_norm=vanish)) if f.category == "grad_norm"]
    assert "vanishing" in f.message


def test_loss_scale_collapse_thrash_and_unbounded() -> None:
    collapse = 2.0 ** (16 - np.arange(N) // 5).clip(-4)  # halves every 5 steps down to 1/16
    found = [f for f in check_health(_base(loss_scale=collapse)) if f.category == "loss_scale"]
    kinds = sorted((f.severity, f.message.split(":")[0]) for f in found)
    assert kinds[0] == ("critical", "loss scale collapsed to 0.125 (max 6.55e+04) from step 80")
    assert any("thrashes" in m for _, m in kinds)
    unbounded = 2.0 ** (16 + np.arange(N) // 10)
    found = [f for f in check_health(_base(loss_scale=unbounded),
                                     RunMeta("r", config={"loss_scale_max": 2**30}))
             if f.category == "loss_scale"]
    assert _summary(found) == [("loss_scale", "warning", (0, 99), 0)]
    assert "no upper bound" in found[0].message


def test_lr_restart_to_warmup_start_is_found_at_its_step() -> None:
    s = np.arange(N)
    lr = 1e-3 * np.minimum(1, (s + 1) / 10) * (1 - s / N)
    lr[60:] = lr[:40]  # the scheduler restarted at step 60
    (f,) = check_health(_base(lr=lr))
    assert _summary([f]) == [("lr_schedule", "warning", (60, 60), 0)]
    assert f.evidence["restart_steps"] == [60]
    meta = RunMeta("r", baseline={"lr_schedule": "cosine_with_restarts"})
    intended = check_health(_base(lr=lr), meta)
    assert _summary(intended) == [("lr_schedule", "info", (60, 60), 0)]


def test_lr_restarts_helper_cases() -> None:
    warm_decay = np.concatenate([np.linspace(0.1, 1, 10), np.linspace(1, 0.1, 30)])
    assert lr_restarts(warm_decay, 0.25, 0.1) == []
    step_lr = np.array([1.0] * 10 + [0.1] * 10 + [0.01] * 10)  # StepLR decays are not restarts
    assert lr_restarts(step_lr, 0.25, 0.1) == []
    sgdr = np.concatenate([np.linspace(1, 0, 10), np.linspace(1, 0, 10)])  # jumps to peak
    assert lr_restarts(sgdr, 0.25, 0.1) == [10]


def test_lr_vs_configured_peak_and_warmup() -> None:
    meta = RunMeta("r", baseline={"lr": 2e-3, "warmup_steps": 20})
    found = check_health(_base(), meta)  # constant 1e-3: wrong peak, no warm-up
    assert sorted(f.message.split(":")[0] for f in found) == [
        "observed peak LR 0.001 differs from the configured 0.002",
        "warm-up was not applied"]


def test_flat_early_loss_and_rising_loss() -> None:
    (f,) = check_health(_base(loss=np.full(N, 2.0)))
    assert _summary([f]) == [("convergence", "warning", (0, 24), 0)]
    rising = np.linspace(1.0, 2.0, N)
    (f,) = check_health(_base(loss=rising))
    assert f.category == "convergence" and "rising" in f.message


def test_plateau_is_info() -> None:
    loss = np.concatenate([np.linspace(3, 1, 60), np.full(40, 1.0)])
    (f,) = check_health(_base(loss=loss))
    assert _summary([f]) == [("convergence", "info", (75, 99), 0)]


def test_no_loss_recorded_is_a_logging_warning() -> None:
    (f,) = check_health(_base(loss=np.full(N, np.nan)),
                        RunMeta("r", environment={"framework": "mindspore"}))
    assert _summary([f]) == [("logging", "warning", (0, 99), None)]
    assert f.message.startswith("metrics are not reaching stepscope")
    assert "custom training cell" in f.message
    (f,) = check_health(_base(lr=np.full(N, np.nan)))
    assert _summary([f]) == [("logging", "info", (0, 99), None)]


def test_data_wait_share_is_sum_over_steady_steps() -> None:
    dw = np.full(N, 0.02)
    (f,) = check_health(_base(data_wait_s=dw))
    # steady steps 1..99: 99 x 0.02 / (99 x 0.1) = 20% exactly
    assert _summary([f]) == [("data_pipeline", "warning", (1, 99), None)]
    assert f.evidence["data_wait_frac"] == pytest.approx(0.2)
    tiny = np.full(N, 0.0009)  # 0.9 ms of 0.01 s steps = 9%, but below the 1 ms floor
    st = np.full(N, 0.01)
    assert check_health(_base(data_wait_s=tiny, step_time_s=st, end_s=np.cumsum(st))) == []


def test_exposed_comm_share() -> None:
    (f,) = check_health(_base(comm_exposed_s=np.full(N, 0.04), comm_s=np.full(N, 0.06)))
    assert _summary([f]) == [("communication", "warning", (1, 99), None)]
    assert f.evidence["comm_frac"] == pytest.approx(0.4) and f.evidence["overlap_measured"]
    (f,) = check_health(_base(comm_s=np.full(N, 0.02)))  # 20%: info, overlap unknown
    assert (f.severity, f.evidence["overlap_measured"]) == ("info", False)


def test_memory_creep_and_pattern() -> None:
    creep = 1e9 + np.arange(N) * 2**20  # +1 MiB per step
    (f,) = check_health(_base(mem_peak_bytes=creep))
    assert _summary([f]) == [("memory", "warning", (1, 99), 0)]
    assert f.evidence["bytes_per_step"] == pytest.approx(2**20, rel=0.05)
    (f,) = check_health(_base(mem_peak_bytes=np.full(N, 3e9), mem_alloc_bytes=np.full(N, 1e9)))
    assert (f.category, f.severity) == ("memory", "info") and "temporary buffers" in f.message


def test_throughput_step_drop_and_progressive_drift() -> None:
    st = np.where(np.arange(N) < 50, 0.1, 0.15)
    st[0] = 1.0
    (f,) = check_health(_base(step_time_s=st, end_s=np.cumsum(st)))
    assert _summary([f]) == [("throughput_regression", "warning", (50, 99), 0)]
    assert f.evidence["before"] == pytest.approx(10000) and f.evidence["after"] == pytest.approx(
        1000 / 0.15)
    drift = 0.1 * (1 + np.arange(N) / 50)
    drift[0] = 1.0
    (f,) = check_health(_base(step_time_s=drift, end_s=np.cumsum(drift)))
    assert f.category == "throughput_regression" and f.evidence["progressive"]


def test_noisy_but_flat_throughput_is_quiet() -> None:
    rng = np.random.default_rng(0)
    st = 0.1 * (1 + 0.1 * rng.standard_normal(N)).clip(0.7)  # 10% jitter, spikes
    st[[20, 40, 77]] = 0.3
    st[0] = 1.0
    assert check_health(_base(step_time_s=st, end_s=np.cumsum(st))) == []


def test_stall_historical_and_live() -> None:
    end = np.cumsum(_base()["step_time_s"])
    end[40:] += 5.0  # nothing for 5.1 s between steps 39 and 40
    (f,) = check_health(_base(end_s=end))
    assert _summary([f]) == [("stall", "warning", (39, 40), 0)]
    assert f.evidence["gap_s"] == pytest.approx(5.1)
    t = _base(end_s=end, wall_time_s=1000.0 + end)
    live = check_health(t, RunMeta("r", status="running"), now_wall_s=1000.0 + end[-1] + 60)
    assert _summary(live)[0] == ("stall", "critical", (99, 99), None)
    finished = check_health(t, RunMeta("r", status="finished"), now_wall_s=1e12)
    assert [f.severity for f in finished] == ["warning"]


def _gap_with_accounting(gap_cpu_s: float, gap_preempt: float) -> StepTable:
    """100 steps of 0.1 s using 0.1 CPU-s and 2 involuntary switches each; 5 s more wall
    time before step 40, in which the process got ``gap_cpu_s`` CPU-s and was switched out
    ``gap_preempt`` times."""
    st = _base()["step_time_s"]
    end = np.cumsum(st)
    end[40:] += 5.0
    cpu, pre = np.full(N, 0.1), np.full(N, 2.0)
    cpu[40], pre[40] = gap_cpu_s, gap_preempt
    return _base(end_s=end, cpu_s=cpu, preempt=pre)


def test_gap_when_the_host_took_the_cpu_is_environment_not_a_stall() -> None:
    # 0.3 CPU-s in 5.1 s (0.06 per wall-s against 1.0) and 400 switches (78/s against 20/s)
    (f,) = check_health(_gap_with_accounting(0.3, 400.0))
    assert _summary([f]) == [("environment", "info", (39, 40), 0)]
    assert f.evidence["cause"] == "contention"
    assert "78 involuntary context switches per second against 20" in f.message
    assert f.evidence["accounting"].startswith("0.30 CPU-s in 5.10 s of wall time")


def test_gap_when_the_process_slept_is_a_stall() -> None:
    # as little CPU but no more switches: the process waited (a hung read, a collective)
    (f,) = check_health(_gap_with_accounting(0.3, 2.0))
    assert _summary([f]) == [("stall", "warning", (39, 40), 0)]
    assert f.evidence["accounting"] == ("0.30 CPU-s in 5.10 s of wall time, 2 involuntary "
                                        "context switches")


def _two_ranks(slow_extra: float, comm_on_fast: float) -> StepTable:
    a, b = _base(), _base()
    cols = {}
    for name in a.columns:
        cols[name] = np.concatenate([a[name], b[name]])
    cols["rank"] = np.repeat([0, 1], N)
    cols["step_time_s"] = cols["step_time_s"] + slow_extra
    # rank 1 works longer; rank 0 waits for it inside the all-reduce
    cols["comm_s"] = np.concatenate([np.full(N, comm_on_fast), np.full(N, 0.002)])
    cols["forward_s"] = np.concatenate([np.full(N, 0.03), np.full(N, 0.03 + slow_extra)])
    return StepTable.from_columns(cols)


def test_straggler_rank_is_named_with_score() -> None:
    (f,) = [f for f in check_health(_two_ranks(0.05, 0.052)) if f.category == "straggler"]
    assert _summary([f]) == [("straggler", "warning", (1, 99), 1)]
    # own time: rank 0 0.15 - 0.052 = 0.098, rank 1 0.15 - 0.002 = 0.148; ref = faster
    assert f.evidence["score"] == pytest.approx(0.098 / 0.148)
    assert f.evidence["phase"] == "forward"


def test_one_straggler_score_for_health_cross_rank_and_trace() -> None:
    """The reference is the lower median: two ranks -> the faster; four -> the second
    fastest (not the mean of the middle two); NaN and non-positive times get no score."""
    from stepscope.analysis.health.config import HealthConfig, straggler_scores
    from stepscope.record.crossrank import STRAGGLER_THRESHOLD, cross_rank_event, stragglers

    assert straggler_scores({0: 0.1, 1: 0.2}) == {0: 1.0, 1: 0.5}
    assert straggler_scores({0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0, 4: math.nan, 5: 0.0}) == {
        0: 2.0, 1: 1.0, 2: pytest.approx(2 / 3), 3: 0.5}
    assert straggler_scores({}) == straggler_scores({0: math.nan}) == {}
    cfg = HealthConfig()
    assert STRAGGLER_THRESHOLD == cfg.straggler_score == 0.8
    assert cfg.stragglers({0: 1.0, 1: 0.8, 2: 0.79}) == stragglers({0: 1.0, 1: 0.8, 2: 0.79})
    assert cfg.stragglers({0: 1.0, 1: 0.8, 2: 0.79}) == [2]
    ev = cross_rank_event(5, ("compute_s",), [[0.1], [0.13]], "compute_s")
    assert (ev["stragglers"], ev["threshold"]) == ([1], 0.8)
    # the health rule scores the same way: own work 0.13 - 0.032 vs 0.13 - 0.002 -> 0.77
    (f,) = [f for f in check_health(_two_ranks(0.03, 0.032)) if f.category == "straggler"]
    meds = {int(r): v for r, v in f.evidence["per_rank_median_s"].items()}
    assert f.evidence["score"] == pytest.approx(straggler_scores(meds)[1])
    assert f.evidence["score"] == pytest.approx(0.098 / 0.128)


def test_balanced_ranks_have_no_straggler() -> None:
    assert [f for f in check_health(_two_ranks(0.0, 0.002)) if f.category == "straggler"] == []


def test_skip_and_config_thresholds() -> None:
    dw = np.full(N, 0.02)
    assert check_health(_base(data_wait_s=dw), skip=("data_wait",)) == []
    assert check_health(_base(data_wait_s=dw), config=HealthConfig(data_wait_warn_frac=0.3)) == []
    assert set(RULES) >= {"numerics", "loss_spike", "stall", "straggler", "logging"}


def test_check_health_does_not_mutate_input() -> None:
    t = _base()
    before = {k: t[k].copy() for k in t.columns}
    check_health(t, RunMeta("r", baseline={"lr": 1.0, "warmup_steps": 5}))
    assert all(np.array_equal(t[k], v, equal_nan=True) for k, v in before.items())


def test_robust_stats_helpers() -> None:
    assert robust_sigma(np.array([1.0, 2.0, 3.0, 4.0, 100.0])) == pytest.approx(1.4826)
    z = trailing_robust_z(np.array([1.0, 2.0] * 10 + [20.0]), window=16, min_periods=8)
    # window median 1.5, MAD 0.5 -> sigma 0.7413; (20 - 1.5) / 0.7413
    assert z[-1] == pytest.approx(18.5 / 0.7413)
    assert np.isnan(z[:8]).all()
    assert runs_of(np.array([0, 1, 1, 0, 1], dtype=bool)) == [(1, 2), (4, 4)]
    assert spearman(np.arange(5.0), np.arange(5.0) ** 2) == pytest.approx(1.0)
    assert best_split(np.array([1.0] * 20 + [5.0] * 20), min_segment=5) == 20
    assert best_split(np.ones(5), min_segment=5) is None


def _phased(scale_compute: float, extra_other: float) -> StepTable:
    """Steps of forward 0.03 + backward 0.05 + optimizer 0.01 + 0.01 other; from step 50 the
    compute phases are scaled and ``extra_other`` seconds are added outside them."""
    s = np.arange(N)
    late = s >= 50
    fw = np.where(late, 0.03 * scale_compute, 0.03)
    bw = np.where(late, 0.05 * scale_compute, 0.05)
    opt = np.where(late, 0.01 * scale_compute, 0.01)
    st = fw + bw + opt + 0.01 + np.where(late, extra_other, 0.0)
    st[0] = 1.0
    return _base(step_time_s=st, end_s=np.cumsum(st), forward_s=fw, backward_s=bw,
                 optimizer_s=opt, data_wait_s=np.zeros(N))


def test_uniform_slowdown_is_the_host_and_a_phase_slowdown_is_named() -> None:
    (f,) = check_health(_phased(1.5, 0.0))  # everything 1.5x slower: a busier host
    assert (f.category, f.severity, f.evidence["uniform_slowdown"]) == (
        "throughput_regression", "info", True)
    (f,) = check_health(_phased(1.0, 0.05))  # 50 ms more outside the phases
    assert (f.severity, f.evidence["slower_phase"], f.steps) == ("warning", "other", (50, 99))


def test_wall_time_growth_without_cpu_growth_is_contention_only_with_preemption() -> None:
    st = np.where(np.arange(N) < 50, 0.1, 0.2)
    st[0] = 1.0
    cpu = np.full(N, 0.09)
    preempt = np.where(np.arange(N) < 50, 2.0, 40.0)  # the kernel took the CPU away
    (f,) = check_health(_base(step_time_s=st, end_s=np.cumsum(st), cpu_s=cpu,
                              preempt=preempt))
    assert (f.severity, f.evidence["cause_hint"]) == ("info", "contention")
    # Same wall/CPU times, preemptions flat: the process sleeps or waits -> a regression.
    (f,) = check_health(_base(step_time_s=st, end_s=np.cumsum(st), cpu_s=cpu,
                              preempt=np.full(N, 2.0)))
    assert (f.severity, f.evidence["cause_hint"]) == ("warning", "waiting")
    assert "waiting, not computing" in f.message
    (f,) = check_health(_base(step_time_s=st, end_s=np.cumsum(st), cpu_s=st * 0.9))
    assert f.severity == "warning"  # CPU time grew with wall time: more work per step


def test_intermittent_slowdown_is_info() -> None:
    st = np.where((np.arange(N) >= 50) & (np.arange(N) % 3 != 0), 0.3, 0.1)  # 2 of 3 slow
    st[0] = 1.0
    found = check_health(_base(step_time_s=st, end_s=np.cumsum(st)))
    assert [(f.category, f.severity) for f in found] == [("throughput_regression", "info")]
    assert found[0].evidence["still_fast_frac"] == pytest.approx(1 / 3, abs=0.02)


def test_lr_jump_after_it_settled_is_a_warning() -> None:
    lr = np.full(N, 1e-3)
    lr[60:] = 0.5  # a manual param_group edit
    (f,) = check_health(_base(lr=lr))
    assert (f.category, f.severity, f.steps) == ("lr_schedule", "warning", (60, 60))
    assert f.evidence["lr_after"] == 0.5
    warm = np.minimum(1.0, (np.arange(N) + 1) / 3) * 1e-3  # a 3-step warm-up is no jump
    assert check_health(_base(lr=warm)) == []


def test_non_finite_loss_on_a_skipped_step_is_overflow_not_nan() -> None:
    loss, ovf = _base()["loss"].copy(), np.zeros(N)
    loss[[20, 40]] = np.nan
    ovf[[20, 40]] = 1
    found = check_health(_base(loss=loss, overflow=ovf))
    assert [(f.category, f.severity) for f in found] == [("numerics", "info")]


def test_recorded_nan_loss_is_read_exactly(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A NaN written by the recorder comes back flagged: certain, at its exact step."""
    from stepscope import Recorder, RunDir
    from stepscope.analysis.health.check import check_health

    rec = Recorder(tmp_path / "run", background=False)
    for i in range(40):
        with rec.step(tokens=64, samples=2) as s:
            s.log(loss=float("nan") if i >= 25 else 3.0 - 0.01 * i, grad_norm=1.0)
    rec.close()
    table, _ = RunDir.open(tmp_path / "run").read_steps()
    found = [f for f in check_health(table) if f.category == "numerics"]
    assert len(found) == 1
    assert found[0].steps == (25, 39) and found[0].confidence == 1.0
    assert found[0].evidence["source"] == "recorded NaN/Inf values"


def test_stall_rule_does_not_blame_training_for_stepscope_time() -> None:
    from stepscope.analysis.health.check import check_health
    from stepscope.schema import StepTable

    n = 40
    end = [0.1 * (i + 1) for i in range(n)]
    end[20:] = [e + 3.0 for e in end[20:]]  # a 3 s gap before step 20
    base = {"rank": [0] * n, "step": list(range(n)), "step_time_s": [0.1] * n,
            "end_s": end, "tokens": [64.0] * n, "loss": [2.0] * n}
    stalled = [f for f in check_health(StepTable.from_columns(base)) if f.category == "stall"]
    assert stalled and stalled[0].steps == (19, 20)
    tool = [float("nan")] * n
    tool[20] = 3.0  # the profiler stopped there: stepscope's own time
    base["tool_s"] = tool
    assert not [f for f in check_health(StepTable.from_columns(base)) if f.category == "stall"]


def test_stall_rule_does_not_count_evaluation_or_checkpoint_between_steps() -> None:
    from stepscope.analysis.health.check import check_health
    from stepscope.schema import StepTable

    n = 40
    end = [0.1 * (i + 1) for i in range(n)]
    end[20:] = [e + 3.0 for e in end[20:]]  # 3 s between steps 19 and 20
    base = {"rank": [0] * n, "step": list(range(n)), "step_time_s": [0.1] * n,
            "end_s": end, "tokens": [64.0] * n, "loss": [2.0] * n}
    eval_s, ckpt_s = [0.0] * n, [0.0] * n
    eval_s[20], ckpt_s[20] = 2.5, 0.5  # a validation run, then a save
    table = StepTable.from_columns({**base, "eval_s": eval_s, "checkpoint_s": ckpt_s})
    assert not [f for f in check_health(table) if f.category == "stall"]
    eval_s[20] = 0.5  # 2 s of the gap unexplained: still a stall
    table = StepTable.from_columns({**base, "eval_s": eval_s, "checkpoint_s": ckpt_s})
    assert [f.steps for f in check_health(table) if f.category == "stall"] == [(19, 20)]


def test_divergence_in_a_short_run_is_a_finding() -> None:
    """10 steps, loss 2.3 -> 2566 (too short for the trend windows)."""
    loss = np.array([2.3, 2.4, 3.1, 9.0, 40.0, 180.0, 700.0, 2566.0, 1900.0, 2100.0])
    t = StepTable.from_columns({"step": np.arange(10), "rank": np.zeros(10, np.int64),
                                "step_time_s": np.full(10, 0.1), "loss": loss})
    [f] = [f for f in check_health(t) if f.rule == "health.convergence"]
    assert (f.severity, f.steps) == ("warning", (0, 7))
    assert f.message == ("loss diverged: 2.3 at step 0, 2566 at step 7 (1.12e+03x) in 10 "
                         "logged steps")
    calm = StepTable.from_columns({"step": np.arange(10), "rank": np.zeros(10, np.int64),
                                   "step_time_s": np.full(10, 0.1),
                                   "loss": np.linspace(2.3, 2.0, 10)})
    assert [f for f in check_health(calm) if f.rule == "health.convergence"] == []
