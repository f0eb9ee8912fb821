"""Health rules over the step table: one config, one context, one rule per concern.

``check_health`` runs every rule; ``HealthConfig`` holds every threshold, each with its source.
"""

from .check import RULES, HealthConfig, HealthContext, Rule, check_health

__all__ = ["HealthConfig", "HealthContext", "Rule", "RULES", "check_health"]
