"""Is the loss really being recorded? Framework-free.

The field report's failure mode: a custom training cell returned something other than the
loss, the dashboard's callback found nothing to log and the loss curve stayed empty without
a word. Adapters pass the raw network outputs here each step; ``LossWatch`` says, once, as
a finding, when no scalar loss can be found, and what was found instead.

Example::

    watch = LossWatch()
    value, what = find_loss(outputs, to_float=lambda t: float(t.asnumpy()))
    finding = watch.observe(step, value, f"were {what}")  # a Finding the 1st time it is None
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..findings import Finding

__all__ = ["find_loss", "describe", "LossWatch", "ambiguous_loss"]


def describe(obj: Any) -> str:
    """Short description of an output value: 'None', 'Tensor(shape=(8, 256))', 'tuple of 2'."""
    if obj is None:
        return "None"
    shape = getattr(obj, "shape", None)
    if shape is not None:
        return f"{type(obj).__name__}(shape={tuple(shape)})"
    if isinstance(obj, (tuple, list)):
        inner = ", ".join(describe(o) for o in obj[:4])
        return f"{type(obj).__name__} of {len(obj)} [{inner}{', ...' if len(obj) > 4 else ''}]"
    return type(obj).__name__


def _scalar(obj: Any, to_float: Callable[[Any], float]) -> float | None:
    if isinstance(obj, bool):
        return None
    if isinstance(obj, (int, float)):
        return float(obj)
    shape = getattr(obj, "shape", None)
    if shape is None:
        return None
    size = 1
    for d in tuple(shape):
        size *= int(d)
    if size != 1 or "bool" in str(getattr(obj, "dtype", "")).lower():
        return None
    try:
        return float(to_float(obj))
    except (TypeError, ValueError, RuntimeError):
        return None


def find_loss(outputs: Any, to_float: Callable[[Any], float]) -> tuple[float | None, str]:
    """(loss, description of ``outputs``). The loss is ``outputs`` itself when it is a
    scalar, else the first element of a tuple/list when that is a scalar (the convention of
    MindSpore's TrainOneStepCell / TrainOneStepWithLossScaleCell: (loss, overflow, scale)).
    None when neither holds (a NaN loss is a loss: a diverged one)."""
    v = _scalar(outputs, to_float)
    if v is None and isinstance(outputs, (tuple, list)) and outputs:
        v = _scalar(outputs[0], to_float)
    return v, describe(outputs)


def ambiguous_loss(outputs: Any) -> str | None:
    """A warning when ``outputs`` is a tuple of several scalars (0-d, not bool), where
    :func:`find_loss` takes the first: a cell returning ``(grad_norm, loss)`` would have its
    norm recorded as the loss. MindSpore's ``(loss, overflow, scale)`` is not ambiguous.
    Shapes only: no value is read (no device sync)."""
    if not isinstance(outputs, (tuple, list)) or len(outputs) < 2:
        return None
    n = sum(1 for o in outputs if tuple(getattr(o, "shape", (0,)) or ()) == ()
            and "bool" not in str(getattr(o, "dtype", "")).lower())
    if n < 2 or (len(outputs) == 3 and "bool" in str(getattr(outputs[1], "dtype", "")).lower()):
        return None
    return (f"the training network returned {n} scalars ({describe(outputs)}); the first was "
            "recorded as the loss. If it is not the loss (e.g. (grad_norm, loss)), return the "
            "loss first")


class LossWatch:
    """Counts steps with and without a loss; reports the first missing one as a finding."""

    def __init__(self, source: str = "the training network's outputs",
                 advice: str = "") -> None:
        self.source = source
        self.advice = advice  # the integration's own way to log a loss, when it has one
        self.with_loss = 0
        self.without_loss = 0
        self._reported = False
        self.first_missing: tuple[int, str] | None = None

    def observe(self, step: int, loss: float | None, what: str) -> Finding | None:
        """Count one step; the finding the first time ``loss`` is None, else None."""
        if loss is not None:
            self.with_loss += 1
            return None
        self.without_loss += 1
        if self._reported:
            return None
        self._reported = True
        self.first_missing = (step, what)
        return self.finding(step, what)

    def finding(self, step: int, what: str) -> Finding:
        return Finding(
            category="logging", severity="critical",
            message=(f"no loss recorded: {self.source} at step {step} {what}; "
                     "the loss curve of this run would be empty"),
            evidence={"step": step, "outputs": what, "steps_without_loss": self.without_loss},
            steps=(step, step),
            recommendation=self.advice or ("return the loss as the network's (first) "
                                           "output, as TrainOneStepCell does, or log it "
                                           "yourself with recorder.log(loss=...)"),
            rule="integration.no_loss",
        )
