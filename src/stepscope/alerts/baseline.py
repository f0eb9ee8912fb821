"""A named baseline run's steady numbers, for rules that compare with it instead of the
run's own steady state (``baseline_run = "runs/base"`` in ``[rules]``).

The numbers are the health-check sheet's, read through the one door (``Run.sheet``: the
sheet ``report`` prints, conditions and all): one definition of the steady median step
time and of tokens/s, per rank.
"""

from __future__ import annotations

from ..errors import StepscopeError
from ..rundir.run import Run

__all__ = ["baseline_numbers"]


def baseline_numbers(path: str) -> tuple[float, float]:
    """(steady median step time in s, tokens/s of one rank) of the run at ``path``.

    Raises ``StepscopeError`` (or a subclass) when it is not a run or has no steady steps.
    """
    sheet = Run.open(path).sheet()
    line = sheet.per_rank[0] if sheet.per_rank else None
    step_time = line.step_time_s if line is not None else sheet.step_time_s
    tokens = line.tokens_per_s if line is not None else sheet.tokens_per_s
    if not step_time:
        raise StepscopeError(f"{path} has no steady steps to compare with")
    return float(step_time), float(tokens or 0.0)
