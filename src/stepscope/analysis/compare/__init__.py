"""One-variable A/B: fingerprint diff, speed and quality ledgers, scaling efficiency."""

from .runs import (
    DERIVED,
    JSON_KEYS,
    VERDICTS,
    Comparison,
    Difference,
    batch_trap,
    compare_runs,
    diff_fingerprints,
)

__all__ = [
    "Difference", "Comparison", "diff_fingerprints", "compare_runs", "batch_trap",
    "DERIVED", "JSON_KEYS", "VERDICTS",
]
