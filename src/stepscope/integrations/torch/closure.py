"""Closure optimizers: ``optimizer.step(closure)`` (LBFGS, Lightning's automatic optimization).

The optimizer step pre-hook runs before the closure: gradients there are the previous
step's (already clipped) or None, and the forward and backward that run inside the
closure would be booked as optimizer time as well. torch lets a step pre-hook return new
arguments, so the pre-hook swaps the closure for :func:`wrap`'s wrapper, which times each
evaluation (the step's optimizer time is then its own time minus the closure's) and
reports the end of the first evaluation: the step's gradient norm is taken there
(``clip_grad_norm_``'s pre-clip value when the closure clipped, as Lightning's does), and
the step's loss, micro-batch and token counts stop there, since later evaluations (LBFGS's
line search) re-run the same batch. ``optimizer.step`` returns the first evaluation's
loss, which is the loss the step records.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ClosureStep", "closure_of", "replace_closure", "wrap"]


def closure_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The closure passed to ``optimizer.step``, or None.

    ``args`` as a step pre-hook sees them: the optimizer first (``step`` is a method).
    """
    c = args[1] if len(args) > 1 else kwargs.get("closure")
    return c if callable(c) else None


def replace_closure(args: tuple[Any, ...], kwargs: dict[str, Any], new: Any
                    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The step's arguments with ``new`` in the closure's place."""
    if len(args) > 1:
        return (args[0], new, *args[2:]), kwargs
    return args, {**kwargs, "closure": new}


def wrap(closure: Any, clock: Callable[[], float],
         on_end: Callable[[int, float], None]) -> Callable[[], Any]:
    """``closure`` timed; ``on_end(evaluation_index, seconds)`` after each evaluation.

    ``on_end`` must not raise (the caller guards it); the closure's own result and
    exceptions reach the optimizer unchanged.
    """
    calls = [0]

    def closure_timed() -> Any:
        index = calls[0]
        calls[0] += 1
        t0 = clock()
        try:
            return closure()
        finally:
            on_end(index, clock() - t0)

    return closure_timed


@dataclass
class ClosureStep:
    """The primary optimizer's closure in the open step."""

    seconds: float = 0.0  # time inside the closure this step (not the optimizer's)
    done: bool = False  # its first evaluation is over: later ones re-run the same batch
    groups: Any = None  # the optimizer's param groups, while a closure step is open

    def start(self, groups: Any) -> None:
        self.groups = groups

    def evaluated(self, seconds: float) -> None:
        self.seconds += seconds

    def first_done(self) -> None:
        self.done = True

    def inside_first(self) -> bool:
        """The closure's first evaluation is running (its forwards are the step's)."""
        return self.groups is not None and not self.done

    def reset(self) -> None:
        self.seconds, self.done, self.groups = 0.0, False, None
