"""The finding: what every health rule and diagnosis returns.

A finding is data (never printed here): a category from ``CATEGORIES``, a severity, a
message a person can read, the evidence (numbers, steps, ranks) behind it, and the next
single experiment or change. ``to_dict`` gives the ``stepscope diagnose --json`` shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Finding", "CATEGORIES", "SEVERITIES", "severity_rank"]

CATEGORIES: tuple[str, ...] = (
    "data_pipeline", "communication", "compute", "memory", "numerics", "loss_spike",
    "grad_norm", "loss_scale", "lr_schedule", "convergence", "throughput_regression",
    "straggler", "stall", "logging", "environment",
)
SEVERITIES: tuple[str, ...] = ("critical", "warning", "info")


def severity_rank(severity: str) -> int:
    """0 for critical, 1 for warning, 2 for info (sort key: most severe first)."""
    return SEVERITIES.index(severity)


@dataclass
class Finding:
    category: str
    severity: str
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    steps: tuple[int, int] | None = None
    rank: int | None = None
    recommendation: str = ""
    confidence: float = 1.0  # 0..1: how sure the rule is (1 = measured directly)
    rule: str = ""  # which rule produced it (e.g. "health.loss_spike")

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"unknown finding category {self.category!r}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "category": self.category,
            "severity": self.severity,
            "message": self.message,
            "evidence": self.evidence,
            "steps": list(self.steps) if self.steps is not None else None,
            "rank": self.rank,
            "recommendation": self.recommendation,
            "confidence": self.confidence,
            "rule": self.rule,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        """The finding of ``to_dict`` (e.g. as stored with the run's cache)."""
        steps = d.get("steps")
        return cls(**{**d, "steps": tuple(steps) if steps is not None else None})
