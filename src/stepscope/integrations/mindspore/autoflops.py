"""MindSpore FLOPs attached to a run without the user passing them: MFU for any network.

Counted once, between the first and the second step, from the forward network and the
first batch (:func:`.flopcount.forward_flops`, the ``counted`` convention: forward FLOPs
x 3), and written into run.json's ``environment`` as ``flops_per_sample`` (and
``flops_per_token`` for token-id inputs). Where it is counted:

* ``Model.train`` (the callback, also injected by ``stepscope run``): the ``network`` given
  to ``Model`` with a ``loss_fn`` is the forward network, called on the batch's first
  column (``WithLossCell``'s ``backbone(data)``); a ``TrainOneStepCell`` over a
  ``WithLossCell`` gives its backbone the same way.
* custom loops under ``stepscope run``: the function given to ``value_and_grad`` is called
  again on its first call's arguments, with the cells it refers to hooked.

The count runs the forward once in PyNative with gradients off and every cell in
inference mode (no BatchNorm statistics move, no dropout draws), then restores each cell's
own mode. It never raises into training: a network it cannot count (a training cell with
no known forward, a shape it cannot run) leaves ``config.flops_counted`` saying why and a
``warning`` event. Its time is stepscope's own (``tool_s`` of the next step).

Example::

    why = attach(session, net, (images,))      # "" when counted
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

from ...record.session import StepSession
from .flopcount import FlopCount, count_call, flops_fields
from .probes import batch_counts

__all__ = ["attach", "forward_of_model", "attach_function", "note"]


def forward_of_model(network: Any, loss_fn: Any) -> tuple[Any, str]:
    """(the forward network of a ``Model``, "") or (None, why not)."""
    if network is None:
        return None, "Model has no network"
    if loss_fn is not None:
        return network, ""
    inner = getattr(network, "network", None)  # TrainOneStepCell(WithLossCell(net, loss))
    backbone = getattr(inner, "_backbone", None)
    if backbone is not None:
        return backbone, ""
    return None, (f"Model was given the training cell {type(network).__name__} and no "
                  "loss_fn: its forward network is not known (running the cell would "
                  "train it)")


def attach(core: StepSession, network: Any, inputs: tuple[Any, ...],
           tokens_per_sample: float | None = None) -> str:
    """Count ``network(*inputs)`` and write the run's FLOPs fields; "" or why not."""
    return _attach(core, lambda: count_call(network, [network], inputs), inputs,
                   tokens_per_sample)


def attach_function(core: StepSession, fn: Callable[..., Any],
                    args: tuple[Any, ...]) -> str:
    """Count a loss function (``value_and_grad``'s) on ``args``: its cells are the
    ``nn.Cell`` objects it refers to (closure and globals); "" or why not."""
    cells = _cells_of(fn)
    if not cells:
        return note(core, "the value_and_grad function refers to no nn.Cell")
    return _attach(core, lambda: count_call(fn, cells, args), args, None)


def _attach(core: StepSession, count: Callable[[], FlopCount], inputs: tuple[Any, ...],
            tokens_per_sample: float | None) -> str:
    t0 = core.clock()
    try:
        result = count()
        if result.total <= 0:
            return note(core, "no nn.Dense, nn.Conv or nn.MultiheadAttention ran in the "
                               "forward")
        tokens, samples = batch_counts(inputs, tokens_per_sample)
        if not samples or math.isnan(samples):
            return note(core, "the batch's first input has no batch dimension")
        fields = flops_fields(result, samples=int(samples),
                              tokens=int(tokens) if tokens == tokens and tokens else None)
        core.rec.run.update_meta(environment=fields,
                                 config={"flops_counted": "from the network and the first "
                                                          "batch's shapes"})
        return ""
    except Exception as exc:  # a count must never stop training
        return note(core, f"{type(exc).__name__}: {str(exc)[:160]}")
    finally:
        core.own_time(t0)  # stepscope's time: the next row's tool_s


def note(core: StepSession, why: str) -> str:
    """Say in run.json and events.jsonl why the run has no counted FLOPs."""
    message = f"FLOPs not counted, so no MFU: {why}"
    try:
        core.rec.run.update_meta(config={"flops_counted": message})
        core.rec.run.append_event({"type": "warning", "rank": core.rank, "message": message})
    except Exception:
        pass
    return why


def _cells_of(fn: Any) -> list[Any]:
    from mindspore import nn

    if isinstance(fn, nn.Cell):  # value_and_grad(WithLossCell(net, loss), ...)
        return [fn]
    try:
        cv = inspect.getclosurevars(inspect.unwrap(fn))
    except (TypeError, ValueError):
        return []
    values = [*cv.nonlocals.values(), *cv.globals.values()]
    return [v for v in values if isinstance(v, nn.Cell) and not isinstance(v, nn.Optimizer)]
