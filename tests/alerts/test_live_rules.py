"""The live rules on step records: a tripled step time fires within M steps, a healthy
noisy run fires nothing, NaN loss and data starvation fire once per episode."""

from __future__ import annotations

import random
from typing import Any

from stepscope.alerts.config import RulesConfig
from stepscope.alerts.rules import LiveRules


def records(n: int, base_s: float = 0.1, noise: float = 0.3, seed: int = 0,
            slow_from: int | None = None, factor: float = 3.0, **extra: Any
            ) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    out = []
    for step in range(n):
        st = base_s * (1 + noise * rnd.random())
        if slow_from is not None and step >= slow_from:
            st *= factor
        out.append({"rank": 0, "step": step, "step_time_s": st, "tokens": 4096.0,
                    "data_wait_s": 0.002 * rnd.random(), "loss": 5.0 - step * 0.001
                    + 0.01 * rnd.random(), **extra})
    return out


def fired(rules: LiveRules, recs: list[dict[str, Any]]) -> list[tuple[str, int | None]]:
    return [(a.rule, a.step) for r in recs for a in rules.observe(r, now_s=0.0)]


def test_tripled_step_time_fires_within_m_steps() -> None:
    cfg = RulesConfig(consecutive=3)
    got = fired(LiveRules(cfg, "exp", 0), records(80, slow_from=40))
    step_time = [s for rule, s in got if rule == "step_time"]
    assert step_time == [42]  # the third slow step in a row, once for the episode
    assert ("throughput", 42) in got  # 1/3 of the steady tokens/s is below 50%


def test_healthy_noisy_run_fires_nothing() -> None:
    for seed in range(5):
        # +-30% uniform noise on every step: a loaded shared CPU.
        assert fired(LiveRules(RulesConfig(), "exp", 0), records(500, seed=seed)) == []


def test_one_slow_step_is_not_an_alert() -> None:
    recs = records(60)
    recs[30]["step_time_s"] *= 10  # a checkpoint save
    recs[45]["step_time_s"] *= 10
    assert fired(LiveRules(RulesConfig(), "exp", 0), recs) == []


def test_absolute_limit_fires_without_a_median() -> None:
    cfg = RulesConfig(max_step_time_s=0.5, consecutive=2, warmup_steps=0)
    recs = [{"step": i, "step_time_s": 0.6} for i in range(4)]
    assert fired(LiveRules(cfg, "exp", 0), recs) == [("step_time", 1)]


def test_nonfinite_loss_is_critical_once_per_episode() -> None:
    recs = records(30)
    for i in (10, 11, 12, 20):
        recs[i]["loss"] = "NaN" if i != 12 else "Infinity"
    rules = LiveRules(RulesConfig(), "exp", 0)
    alerts = [a for r in recs for a in rules.observe(r, now_s=0.0)]
    assert [(a.rule, a.step, a.severity) for a in alerts] == [
        ("nonfinite_loss", 10, "critical"), ("nonfinite_loss", 20, "critical")]


def test_missing_loss_is_not_nan() -> None:
    recs = records(30)
    for r in recs[5:]:
        del r["loss"]
    assert fired(LiveRules(RulesConfig(), "exp", 0), recs) == []


def test_data_starvation_fires() -> None:
    recs = records(40)
    for r in recs[20:]:
        r["data_wait_s"] = 0.8 * r["step_time_s"]
    got = fired(LiveRules(RulesConfig(step_time_factor=100.0, min_tokens_per_s_frac=0.0),
                          "exp", 0), recs)
    assert got == [("data_wait", 22)]


def test_loss_spike_fires_and_disable_silences_it() -> None:
    recs = records(60)
    recs[50]["loss"] = 50.0
    assert ("loss_spike", 50) in fired(LiveRules(RulesConfig(), "exp", 0), recs)
    quiet = RulesConfig(disable=("loss_spike",))
    assert fired(LiveRules(quiet, "exp", 0), recs) == []


def test_alert_carries_run_rank_numbers_and_next_step() -> None:
    rules = LiveRules(RulesConfig(), "exp7", 3)
    [alert] = [a for r in records(60, slow_from=40) for a in rules.observe(r, now_s=5.0)
               if a.rule == "step_time"]
    assert (alert.run, alert.rank, alert.step, alert.time_s) == ("exp7", 3, 42, 5.0)
    assert alert.values["step_time_s"] > 2 * alert.values["median_s"]
    assert "step 40" in alert.next_step and alert.source


def test_grad_norm_explosion_and_loss_scale_collapse() -> None:
    recs = records(40)
    for i, r in enumerate(recs):
        r["grad_norm"] = 1.0 + 0.1 * (i % 3)
        r["loss_scale"] = 65536.0
    recs[30]["grad_norm"] = 50.0
    recs[35]["grad_norm"] = "Infinity"  # an AMP-skipped step, not an explosion
    for r in recs[36:]:
        r["loss_scale"] = 0.5
    got = fired(LiveRules(RulesConfig(), "exp", 0), recs)
    assert got == [("grad_norm", 30), ("loss_scale", 36)]


def test_baseline_median_replaces_the_runs_own() -> None:
    # This run is uniformly 3x slower than its baseline: its own median would never fire.
    cfg = RulesConfig(baseline_step_time_s=0.1, baseline_tokens_per_s=4096 / 0.1)
    got = fired(LiveRules(cfg, "exp", 0), records(20, base_s=0.3, noise=0.0))
    assert ("step_time", 7) in got and ("throughput", 7) in got
