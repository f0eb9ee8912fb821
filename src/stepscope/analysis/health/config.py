"""Thresholds of the health rules, each with where it comes from, and the rule context.

Every threshold is a field of :class:`HealthConfig` so a user can tune a rule without
editing code (``HealthConfig(data_wait_warn_frac=0.10)``). Defaults are chosen to be quiet on
a healthy run recorded on a noisy shared CPU and loud on the failure modes of the field
report (../shared/FIELD-REPORT.md); the comment on each field says which.

Example::

    from stepscope.analysis.health import check_health, HealthConfig
    findings = check_health(table, meta, HealthConfig(spike_z=8.0))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ...calc.straggler import STRAGGLER_SCORE, straggler_scores
from ...schema import AnyArray, RunMeta, StepTable

__all__ = ["HealthConfig", "HealthContext", "straggler_scores"]


@dataclass(frozen=True)
class HealthConfig:
    """All thresholds of the health rules (see each field's comment for its source)."""

    # -- warm-up / general ---------------------------------------------------------------
    # Rules on trends need this many steady steps; fewer gives no finding (not a guess).
    min_steps: int = 12
    # Robust sigma = 1.4826 x MAD (consistent with the std of a normal distribution).
    # Floor of the robust sigma, as a fraction of the window median: keeps z finite on a
    # perfectly smooth series (a 1% wiggle is never a 6-sigma event).
    robust_rel_floor: float = 0.01

    # -- numerics ------------------------------------------------------------------------
    # Loss present on >= this share of a rank's steps before a gap is read as non-finite
    # (the store writes NaN/Inf as missing; sparse logging must not look like NaN).
    nonfinite_min_coverage: float = 0.9
    # Overflow-skipped steps above this share of steady steps -> warning (GradScaler's
    # equilibrium is about one skip per growth_interval = 2000 steps, i.e. 0.05%).
    overflow_warn_frac: float = 0.05

    # -- loss spikes ---------------------------------------------------------------------
    # OLMo skips a step when loss > mean + 6 sigma over the last 128 steps
    # (allenai/OLMo, train.py, `max_grad_norm` / loss-spike handling); robust version here.
    spike_window: int = 128
    spike_min_periods: int = 10
    spike_z: float = 6.0
    # A spike must also be this much above the window median (guards near-zero MAD).
    spike_min_ratio: float = 1.2
    # LLM-Foundry's loss-spike callback: loss >= 2x the window mean for > 4 steps is a
    # sustained spike (llmfoundry/callbacks/kill_loss_spike_callback.py).
    sustained_ratio: float = 2.0
    sustained_steps: int = 4
    max_spike_findings: int = 5

    # -- gradient norm -------------------------------------------------------------------
    grad_window: int = 64
    # A jump is >= 10x the trailing median (one order of magnitude) and >= spike_z robust
    # sigmas in log space; stepscope's choice, the usual "explosion" scale in practice.
    grad_jump_factor: float = 10.0
    # Sustained growth / vanishing: last-quarter median vs first steady quarter median.
    grad_growth_factor: float = 10.0
    grad_vanish_factor: float = 1e-3
    # Jumps within +-1 step of a loss-scale backoff are "coinciding" (field report: periodic
    # grad-norm jumps usually mean the dynamic loss scale is oscillating).
    grad_scale_coincide_frac: float = 0.5
    grad_scale_min_jumps: int = 3

    # -- loss scale ----------------------------------------------------------------------
    # Thrash: more than this many backoffs per 1000 steps (GradScaler and MindSpore's
    # DynamicLossScaleManager grow after 2000 clean steps, so equilibrium is ~0.5/1000).
    scale_thrash_per_1000: float = 10.0
    scale_thrash_min_backoffs: int = 4
    # Collapse: the scale ended at or below this (field report: the scale shrank until fp16
    # gradients were all zero, NaN after 500 steps). GradScaler starts at 2**16.
    scale_collapse_at: float = 1.0
    # Unbounded: a scale at or above 2**24 means it kept growing with no upper bound.
    scale_unbounded_at: float = 2.0**24

    # -- learning rate -------------------------------------------------------------------
    # A restart is an LR change of >= 25% of the schedule's range in one step that lands
    # within 10% of the range of the LR the schedule started at (or of its peak, after it
    # had decayed): the "scheduler silently reset" story of the field report.
    lr_jump_frac: float = 0.25
    lr_near_frac: float = 0.10
    # Observed peak LR vs configured peak in run.json: relative tolerance.
    lr_peak_tolerance: float = 0.05
    # Observed warm-up length vs configured warmup_steps: factor either way.
    lr_warmup_tolerance: float = 0.5

    # -- convergence ---------------------------------------------------------------------
    # Early window: the first 25% of loss values (at least conv_min_points).
    conv_early_frac: float = 0.25
    conv_min_points: int = 20
    # Fewer logged losses than this cannot tell a slow start from noise: no finding.
    conv_min_total: int = 60
    # Loss falling by less than 1% over the early window is "abnormally flat" (field report:
    # data starvation or repeated samples).
    conv_flat_drop: float = 0.01
    # ... a warning only when the whole run improved by less than 5% (first vs last quarter
    # medians): a slow start that then converges is info.
    conv_stuck_drop: float = 0.05
    # Plateau: the last quarter improves by less than 0.2% (info only: plateaus are normal).
    conv_plateau_drop: float = 0.002
    # Divergence: last-quarter median above the early median by this share.
    conv_diverge_rise: float = 0.10
    # Runs too short for those windows: a loss that reached 10x its first value diverged
    # (a 10-step run once went 2.3 -> 2566 with no finding; noise is not a tenfold rise).
    conv_short_rise_factor: float = 10.0

    # -- throughput ----------------------------------------------------------------------
    # A drop of >= 20% tokens/s between segments is a regression (field report: 1200 -> 800
    # tokens/s is -33%; 20% stays above the run-to-run noise of a shared CPU).
    regression_drop: float = 0.20
    # Each side of a change point spans >= 15 steps (and >= 10% of the run), and the rule
    # needs >= 50 steady steps: on shorter runs a burst of load from another process on a
    # shared host cannot be told from a regression.
    regression_min_segment: int = 15
    regression_min_steps: int = 50
    # A slowdown where >= 20% of the later steps still run within 10% of the earlier median
    # step time is intermittent (preemption by other processes spares some steps): info.
    regression_intermittent_frac: float = 0.20
    regression_fast_tol: float = 0.10
    # Progressive drift: Spearman correlation of step index and step time at least this.
    drift_min_corr: float = 0.5

    # -- system --------------------------------------------------------------------------
    # Data wait above 5% of step time -> warning (MindInsight's "queue idle").
    data_wait_warn_frac: float = 0.05
    # ... and at least 1 ms per step (timer resolution and loop overhead on tiny CPU steps).
    data_wait_min_s: float = 0.001
    # Exposed communication above 30% of the step -> compute and comm not overlapped
    # (field report). Above 15%: info.
    comm_warn_frac: float = 0.30
    comm_info_frac: float = 0.15
    # Memory creep: peak grows >= 5% and >= 32 MiB from the first to the last steady quarter
    # with a rank correlation >= 0.7 (monotone growth, not noise).
    mem_creep_frac: float = 0.05
    mem_creep_min_bytes: float = 32 * 2**20
    mem_creep_min_corr: float = 0.7
    # Memory pattern: peak / end-of-step allocation >= 1.5 -> temporary buffers dominate;
    # <= 1.1 -> a high plateau of weights / optimizer states (field report, memory section).
    mem_temp_ratio: float = 1.5
    mem_plateau_ratio: float = 1.1
    # Straggler: the one definition (calc/straggler.py: the score, NVIDIA's relative
    # performance score, and why 0.8), used by this rule, the cross-rank view recorded
    # during training, diagnose and the trace breakdown. A rank scoring below it is a
    # straggler ...
    straggler_score: float = STRAGGLER_SCORE
    # ... when the excess is also >= 5% of the median step and >= 1 ms, and the rank is the
    # slow one on >= 60% of steps (consistently, not one bad step).
    straggler_min_excess_frac: float = 0.05
    straggler_min_excess_s: float = 0.001
    straggler_consistency: float = 0.6
    # Stall: no step finished for k x the median step time, and at least this long.
    stall_factor: float = 10.0
    stall_min_s: float = 1.0

    # -- logging -------------------------------------------------------------------------
    logging_min_steps: int = 5

    def stragglers(self, scores: Mapping[int, float]) -> list[int]:
        """The ranks whose :func:`straggler_scores` score is below ``straggler_score``."""
        return sorted(r for r, s in scores.items() if s < self.straggler_score)


@dataclass
class HealthContext:
    """What every rule reads: the sorted table, its steady mask, run.json and 'now'.

    ``now_wall_s`` is the current UNIX time, passed in (never read here) so the live-stall
    rule is testable with exact numbers.
    """

    table: StepTable
    meta: RunMeta | None
    config: HealthConfig
    steady: AnyArray
    now_wall_s: float | None = None
    notes: list[str] = field(default_factory=list)
