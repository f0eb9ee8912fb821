"""The loss a user logs under gradient accumulation, from the tensors backward ran on.

A step's loss is what ``backward()`` was called on, summed over its micro-batches. Loops
that divide each micro-batch loss by the accumulation count k before backward (nanoGPT,
``accelerator.backward``, Lightning's ``accumulate_grad_batches``) then give the mean over
the micro-batches -- except on a step with fewer than k micro-batches (the partial last
step of an epoch), where the sum is n/k of the mean (accelerate at an epoch's end: half).

So each captured loss remembers its divisor when its autograd node is a division by (or a
multiplication with the inverse of) a constant: a host scalar that does not require
grad. A divisor k is *confirmed* once a step had exactly k micro-batches each divided by
k; from then on a step whose micro-batch losses all carry that divisor records
``sum * k / n`` = the mean of the undivided micro-batch losses. A division by anything
else (a token count, a loss that is naturally a ratio) is never confirmed and changes
nothing. Reading the divisor never synchronises a device: only CPU scalars are read.

Example::

    k = divisor(loss / 4)                   # 4.0
    step_loss([l1 / 4], [4.0], confirmed=4.0)   # == l1 (one micro-batch of an accum-4 loop)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["Accumulation", "divisor", "confirms", "step_loss", "CONVENTION"]

CONVENTION = ("mean over the optimizer step's micro-batches (a 1/k scaling applied before "
              "backward is undone, k = {k:g})")


def divisor(tensor: Any) -> float | None:
    """k when ``tensor`` was computed as ``x / k`` or ``x * (1/k)`` with k a constant."""
    fn = getattr(tensor, "grad_fn", None)
    if fn is None:
        return None
    name = fn.name()
    if name not in ("DivBackward0", "MulBackward0"):
        return None
    nxt = fn.next_functions
    if len(nxt) != 2 or nxt[1][0] is not None:  # the other operand requires grad
        return None
    other = getattr(fn, "_saved_other", None)
    if other is None or other.numel() != 1 or other.device.type != "cpu":
        return None
    v = float(other)
    if name == "MulBackward0":
        v = 1.0 / v if v else math.nan
    return v if math.isfinite(v) and v > 1.0 else None


def confirms(divisors: Sequence[float | None]) -> float | None:
    """The divisor k this step confirms: exactly k micro-batches, each divided by k."""
    if not divisors or divisors[0] is None:
        return None
    k = divisors[0]
    if all(d == k for d in divisors) and abs(len(divisors) - k) < 1e-9:
        return k
    return None


def step_loss(values: Sequence[float], divisors: Sequence[float | None],
              confirmed: float | None) -> float:
    """The step's loss: the sum, rescaled to the micro-batch mean under a confirmed k."""
    total = float(sum(values))
    n = len(values)
    if confirmed is not None and n and all(d == confirmed for d in divisors):
        return total * confirmed / n
    return total


class Accumulation:
    """The run's accumulation divisor, and the loss tensors backward runs on.

    A GradScaler's ``scale(loss)`` gives backward a scaled copy: the loss and its divisor
    are read from the unscaled tensor it was made from (kept for the step, by id).
    """

    def __init__(self) -> None:
        self.k: float | None = None  # the run's confirmed divisor
        self.divisor: float | None = None  # of the loss backward() is running on
        self.scaler: Any = None  # the GradScaler in use, once one scaled a loss
        self._scaled: dict[int, Any] = {}

    def scaled(self, scaler: Any, out: Any, loss: Any) -> None:
        """``scaler.scale(loss)`` returned ``out``."""
        self.scaler = scaler
        if out is not loss and hasattr(out, "numel") and out.numel() == 1:
            self._scaled[id(out)] = loss

    def loss_of(self, tensor: Any) -> Any:
        """The loss ``tensor`` stands for: the unscaled one when a GradScaler scaled it."""
        src = self._scaled.get(id(tensor))
        return src if src is not None else tensor

    def before_backward(self, tensor: Any, replay: bool) -> None:
        """Read the loss's divisor while its graph is alive (none for a closure's
        re-evaluation, ``replay``)."""
        self.divisor = None
        if tensor is not None and tensor.numel() == 1 and not replay:
            self.divisor = divisor(self.loss_of(tensor))

    def confirm(self, divisors: Sequence[float | None]) -> str | None:
        """A step ended with these divisors: the loss convention when it confirms the
        run's k for the first time, else None."""
        k = confirms(divisors)
        if k is None or self.k is not None:
            return None
        self.k = k
        return CONVENTION.format(k=k)

    def end_step(self) -> None:
        self._scaled.clear()
