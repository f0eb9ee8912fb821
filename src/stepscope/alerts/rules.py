"""The live rules: the health rules, evaluated one step record at a time.

They read the records the writer thread writes (``{"rank": 0, "step": 12, "step_time_s":
0.31, "loss": "NaN", ...}``), so the in-process monitor (fed by the writer thread) and
``stepscope watch`` (fed by the step files) apply exactly the same rules. Pure: no clock,
no I/O; ``observe`` returns the alerts a record fires.

Each rule compares a step with the run's own *steady* state: the median over a rolling
window of the last ``window_steps`` normal steps after ``warmup_steps`` (a step that is
itself slow does not enter the window, so a slowdown cannot become the new normal while it
is being reported). A rule fires once per episode (``consecutive`` bad steps in a row) and
re-arms when a step is normal again.

Example::

    rules = LiveRules(RulesConfig(), run="exp1", rank=0)
    for record in records:
        for alert in rules.observe(record, now_s=time.time()):
            dispatcher.submit(alert)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..analysis.health.config import HealthConfig
from .config import RulesConfig
from .env_rules import EnvironmentRule
from .memory import MemoryTrend
from .model import Alert, Severity
from .rolling import RollingMedian, record_value

__all__ = ["LiveRules", "RollingMedian", "record_value"]

_SRC = "stepscope live rules"


class _Streak:
    """Counts bad steps in a row; ``hit`` is True exactly once per episode."""

    def __init__(self) -> None:
        self.count = 0
        self.first_step: int | None = None

    def update(self, bad: bool, step: int | None, needed: int) -> bool:
        if not bad:
            self.count, self.first_step = 0, None
            return False
        if self.count == 0:
            self.first_step = step
        self.count += 1
        return self.count == needed


class LiveRules:
    """Per-rank live rules over step records (see the module docstring)."""

    def __init__(self, config: RulesConfig, run: str, rank: int,
                 health: HealthConfig | None = None) -> None:
        self.cfg, self.run, self.rank = config, run, rank
        self.health = health or HealthConfig()
        self.steps_seen = 0
        self.step_times = RollingMedian(config.window_steps)
        self.tokens_per_s = RollingMedian(config.window_steps)
        self.losses = RollingMedian(self.health.spike_window)
        self.grad_norms = RollingMedian(self.health.grad_window)
        self.memory = MemoryTrend(self.health)
        self.environment = EnvironmentRule(run, rank, config.consecutive, config.window_steps)
        self._streaks = {name: _Streak() for name in ("step_time", "throughput", "data_wait")}
        self._nonfinite = False
        self._fired_once: set[str] = set()

    def steady_median_s(self) -> float | None:
        """The baseline run's median step time, else this run's steady median once it is
        known (None during warm-up)."""
        if self.cfg.baseline_step_time_s > 0:
            return self.cfg.baseline_step_time_s
        return self.step_times.median() if len(self.step_times) >= self.health.min_steps else None

    def _steady_tokens_per_s(self) -> float | None:
        if self.cfg.baseline_tokens_per_s > 0:
            return self.cfg.baseline_tokens_per_s
        ready = len(self.tokens_per_s) >= self.health.min_steps
        return self.tokens_per_s.median() if ready else None

    def observe(self, record: Mapping[str, Any], now_s: float) -> list[Alert]:
        """The alerts this step record fires (usually none)."""
        step_v = record.get("step")
        step = int(step_v) if isinstance(step_v, (int, float)) else None
        out: list[Alert] = []
        self._loss(record, step, now_s, out)
        st = record_value(record, "step_time_s")
        if st is None or not math.isfinite(st) or st <= 0:
            return out  # a value logged after its step closed, or no timing at all
        self.steps_seen += 1
        if self.steps_seen <= self.cfg.warmup_steps:
            return out
        self._grad_and_scale(record, step, now_s, out)
        out.extend(a for a in self.environment.observe_step(record, step, now_s)
                   if self._on(a.rule))
        self._memory(record, step, now_s, out)
        slow = self._step_time(st, step, now_s, out)
        self._throughput(record, st, step, now_s, out)
        self._data_wait(record, st, step, now_s, out)
        if not slow:
            self.step_times.push(st)
        return out

    def observe_conditions(self, sample: Mapping[str, Any]) -> None:
        """A condition sample of this rank (conditions.py), for the environment rules."""
        self.environment.observe_sample(sample)

    def _on(self, rule: str) -> bool:
        return rule not in self.cfg.disable

    def _alert(self, rule: str, severity: Severity, step: int | None, message: str, next_step: str,
               values: dict[str, float], now_s: float, source: str = _SRC) -> Alert:
        return Alert(rule=rule, severity=severity, run=self.run, rank=self.rank,
                     step=step, message=message, next_step=next_step, source=source,
                     values=values, time_s=now_s)

    def _step_time(self, st: float, step: int | None, now_s: float, out: list[Alert]) -> bool:
        med = self.steady_median_s()
        cfg = self.cfg
        over_abs = cfg.max_step_time_s > 0 and st > cfg.max_step_time_s
        over_rel = med is not None and st > cfg.step_time_factor * med
        slow = over_abs or over_rel
        streak = self._streaks["step_time"]
        if streak.update(slow, step, cfg.consecutive) and self._on("step_time"):
            ratio = st / med if med else math.nan
            ref = "the baseline run's median" if cfg.baseline_step_time_s else "the steady median"
            what = (f"{ratio:.1f}x {ref} {med:.3g} s" if over_rel and med
                    else f"above the limit {cfg.max_step_time_s:g} s")
            out.append(self._alert(
                "step_time", "warning", step,
                f"step time {st:.3g} s is {what}, {cfg.consecutive} steps in a row "
                f"(since step {streak.first_step})",
                f"find what changed at step {streak.first_step}: data wait, other processes "
                "on the host, a slower rank (`stepscope diagnose RUN`)",
                {"step_time_s": st, "median_s": med or math.nan,
                 "factor": cfg.step_time_factor, "consecutive": float(cfg.consecutive)},
                now_s, "field report: step time above a threshold M times in a row"))
        return slow

    def _throughput(self, record: Mapping[str, Any], st: float, step: int | None,
                    now_s: float, out: list[Alert]) -> None:
        tokens = record_value(record, "tokens")
        if tokens is None or not math.isfinite(tokens) or tokens <= 0:
            return
        tps = tokens / st
        med = self._steady_tokens_per_s()
        low = med is not None and tps < self.cfg.min_tokens_per_s_frac * med
        if self._streaks["throughput"].update(low, step, self.cfg.consecutive) and self._on(
                "throughput") and med is not None:
            out.append(self._alert(
                "throughput", "warning", step,
                f"tokens/s {tps:.4g} is {100 * tps / med:.0f}% of the steady {med:.4g}, "
                f"{self.cfg.consecutive} steps in a row",
                "check the input pipeline and the host's load; `stepscope diagnose RUN` "
                "names the phase that grew",
                {"tokens_per_s": tps, "steady_tokens_per_s": med,
                 "min_frac": self.cfg.min_tokens_per_s_frac}, now_s))
        if not low:
            self.tokens_per_s.push(tps)

    def _data_wait(self, record: Mapping[str, Any], st: float, step: int | None, now_s: float,
                   out: list[Alert]) -> None:
        dw = record_value(record, "data_wait_s")
        if dw is None or not math.isfinite(dw):
            return
        share = dw / st
        bad = share > self.cfg.data_wait_frac and dw >= self.health.data_wait_min_s
        if self._streaks["data_wait"].update(bad, step, self.cfg.consecutive) and self._on(
                "data_wait"):
            out.append(self._alert(
                "data_wait", "warning", step,
                f"{100 * share:.0f}% of the step ({dw:.3g} s) is spent waiting for data, "
                f"{self.cfg.consecutive} steps in a row",
                "the input pipeline cannot keep up: check data-loader workers, storage, "
                "retries on bad files (`stepscope isolate data`)",
                {"data_wait_s": dw, "step_time_s": st, "share": share,
                 "threshold": self.cfg.data_wait_frac}, now_s))

    def _loss(self, record: Mapping[str, Any], step: int | None, now_s: float,
              out: list[Alert]) -> None:
        loss = record_value(record, "loss")
        if loss is None:
            return
        if not math.isfinite(loss):
            if not self._nonfinite and self._on("nonfinite_loss"):
                out.append(self._alert(
                    "nonfinite_loss", "critical", step, f"loss is {loss}",
                    "stop and inspect: learning rate, loss scale, the batch at this step; "
                    "resume from the last good checkpoint",
                    {"loss": loss}, now_s))
            self._nonfinite = True
            return
        self._nonfinite = False
        self._spike(loss, step, now_s, out)
        self.losses.push(loss)

    def _spike(self, loss: float, step: int | None, now_s: float, out: list[Alert]) -> None:
        h = self.health
        if len(self.losses) < h.spike_min_periods or not self._on("loss_spike"):
            return
        med = self.losses.median()
        sigma = max(1.4826 * self.losses.mad(), h.robust_rel_floor * abs(med))
        z = (loss - med) / sigma if sigma > 0 else 0.0
        if z >= h.spike_z and loss >= h.spike_min_ratio * med:
            out.append(self._alert(
                "loss_spike", "warning", step,
                f"loss {loss:.4g} is {z:.1f} robust sigmas above the recent median {med:.4g}",
                "look at the batch and the learning rate at this step; a run of spikes "
                "often precedes divergence",
                {"loss": loss, "median_loss": med, "z": z}, now_s,
                "OLMo's 6-sigma loss-spike rule, robust version (analysis/health)"))

    def _once(self, rule: str) -> bool:
        if rule in self._fired_once or not self._on(rule):
            return False
        self._fired_once.add(rule)
        return True

    def _grad_and_scale(self, record: Mapping[str, Any], step: int | None, now_s: float,
                        out: list[Alert]) -> None:
        h = self.health
        gn = record_value(record, "grad_norm")
        if gn is not None and math.isfinite(gn):  # inf/NaN norms: AMP's skipped steps
            if len(self.grad_norms) >= h.spike_min_periods and self._on("grad_norm"):
                med = self.grad_norms.median()
                if med > 0 and gn >= h.grad_jump_factor * med:
                    out.append(self._alert(
                        "grad_norm", "warning", step,
                        f"gradient norm {gn:.4g} is {gn / med:.0f}x its recent median {med:.4g}",
                        "an exploding gradient: check the learning rate, clipping and the "
                        "batch at this step", {"grad_norm": gn, "median_grad_norm": med},
                        now_s, "health rules: grad_jump_factor (analysis/health)"))
            self.grad_norms.push(gn)
        scale = record_value(record, "loss_scale")
        if scale is not None and scale <= h.scale_collapse_at and self._once("loss_scale"):
            out.append(self._alert(
                "loss_scale", "critical", step,
                f"the dynamic loss scale collapsed to {scale:g}",
                "fp16 gradients are underflowing to zero: use bf16, or find the op that "
                "overflows every step", {"loss_scale": scale}, now_s,
                "health rules: scale_collapse_at (field report, loss-scale section)"))

    def _memory(self, record: Mapping[str, Any], step: int | None, now_s: float,
                out: list[Alert]) -> None:
        mem = record_value(record, "mem_peak_bytes")
        if mem is None or not math.isfinite(mem) or mem <= 0 or not self._on("memory_creep") \
                or "memory_creep" in self._fired_once:  # once per run: no more judging
            return
        creep = self.memory.push(step if step is not None else self.steps_seen, mem)
        if creep is None or not self._once("memory_creep"):
            return
        c, mib = creep, 2.0**20
        grew = c.last_bytes - c.first_bytes
        out.append(self._alert(
            "memory_creep", "warning", step,
            f"peak memory keeps growing: {c.first_bytes / mib:.0f} MiB to "
            f"{c.last_bytes / mib:.0f} MiB (+{100 * grew / c.first_bytes:.0f}%) over steps "
            f"{c.first_step}-{c.last_step}, {c.bytes_per_step / mib:.2f} MiB per step "
            f"(rank correlation {c.rank_correlation:.2f})",
            "something keeps references across steps (a list of losses with graphs, a "
            "cache); at this rate it ends in out-of-memory",
            {"mem_peak_bytes": c.last_bytes, "first_mem_peak_bytes": c.first_bytes,
             "bytes_per_step": c.bytes_per_step, "rank_correlation": c.rank_correlation},
            now_s, "health rules: memory_creep (mem_creep_frac, mem_creep_min_bytes, "
            "mem_creep_min_corr; Theil-Sen slopes in both halves)"))
