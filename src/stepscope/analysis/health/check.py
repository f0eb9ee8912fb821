"""Health rules over a run's step table: is it converging, fed, and numerically sane?

One entry point, :func:`check_health`, runs every rule in :data:`RULES` and returns the
findings, most severe first. Each rule is a pure function ``rule(ctx) -> list[Finding]``
in one of four modules, documented there with its source and thresholds:

* ``health_numerics``: non-finite loss/grad norm, overflow skips, loss spikes (OLMo robust
  z over a trailing window; LLM-Foundry sustained 2x), gradient-norm jumps/growth/vanishing
  (and jumps at loss-scale backoffs), loss-scale thrash/collapse/unbounded.
* ``health_training``: LR restarts and peak/warm-up vs run.json, convergence (flat early
  slope, plateau, divergence), logging (steps advance but no loss recorded).
* ``health_system``: data-wait share, exposed communication, memory creep/pattern,
  throughput regressions and drift (naming the slower phase, or a uniformly slower host).
* ``health_ranks``: stragglers, stalls (also live, with ``now_wall_s``).

Every threshold lives in :class:`HealthConfig`. Warm-up steps are excluded with the
sheet's own ``steady_mask`` (one definition for the whole project).

Example::

    table, _ = RunDir.open("runs/exp1").read_steps()
    for f in check_health(table, meta, now_wall_s=time.time()):
        print(f.severity, f.category, f.steps, f.message)
"""

from __future__ import annotations

from collections.abc import Callable

from ...findings import Finding, severity_rank
from ...schema import RunMeta, StepTable
from ..summary import steady_mask
from .config import HealthConfig, HealthContext
from .numerics import (
    rule_grad_norm,
    rule_loss_scale,
    rule_loss_spikes,
    rule_numerics,
    rule_overflow,
)
from .ranks import rule_stall, rule_straggler
from .system import rule_comm, rule_data_wait, rule_memory, rule_throughput
from .training import rule_convergence, rule_logging, rule_lr_schedule

__all__ = ["HealthConfig", "HealthContext", "Rule", "RULES", "check_health"]

Rule = Callable[[HealthContext], list[Finding]]

# Name -> rule; the name is what ``Finding.rule`` says and what ``skip=`` accepts.
RULES: dict[str, Rule] = {
    "numerics": rule_numerics,
    "overflow": rule_overflow,
    "loss_spike": rule_loss_spikes,
    "grad_norm": rule_grad_norm,
    "loss_scale": rule_loss_scale,
    "lr_schedule": rule_lr_schedule,
    "convergence": rule_convergence,
    "logging": rule_logging,
    "data_wait": rule_data_wait,
    "comm": rule_comm,
    "memory": rule_memory,
    "throughput": rule_throughput,
    "straggler": rule_straggler,
    "stall": rule_stall,
}


def check_health(table: StepTable, meta: RunMeta | None = None,
                 config: HealthConfig | None = None, *, now_wall_s: float | None = None,
                 skip: tuple[str, ...] = ()) -> list[Finding]:
    """Run every health rule; findings ordered most severe first, then by step.

    ``now_wall_s`` (UNIX seconds, injected) enables the live-stall rule for a running run.
    ``skip`` names rules of :data:`RULES` not to run.
    """
    if not len(table):
        return []
    t = table.sorted()
    ctx = HealthContext(table=t, meta=meta, config=config or HealthConfig(),
                        steady=steady_mask(t), now_wall_s=now_wall_s)
    findings: list[Finding] = []
    for name, rule in RULES.items():
        if name not in skip:
            findings.extend(rule(ctx))
    findings.sort(key=lambda f: (severity_rank(f.severity), f.steps[0] if f.steps else -1))
    return findings
