"""Health rules over the step table: one config, one context, one rule per concern.

``check_health`` runs every rule; ``HealthConfig`` holds every threshold, each with its source.

The names are re-exported lazily (PEP 562): the trace breakdown and the cross-rank view
inside training processes import only ``health.config`` (the straggler score), not the
rules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["HealthConfig", "HealthContext", "Rule", "RULES", "check_health"]

_LAZY = {"HealthConfig": "config", "HealthContext": "config", "Rule": "check",
         "RULES": "check", "check_health": "check"}

if TYPE_CHECKING:
    from .check import RULES, Rule, check_health
    from .config import HealthConfig, HealthContext


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
