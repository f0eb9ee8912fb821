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

__all__ = ["divisor", "confirms", "step_loss", "CONVENTION"]

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
