"""Loss scaling as it happened: the scale each step ran with, its overflow, and set-ups
that cannot work.

A dynamic scale is adjusted inside the step (after the gradients' finiteness is known), so
the value read after the step is the *next* step's. :class:`ScaleWatch` reads it when the
step begins (the scale the step ran with) and again when it ends: a scale that fell was
an overflow (dynamic scalers back off only then), unless the step said so itself.

Example::

    watch = ScaleWatch()
    watch.begin(train_network, manager)      # at step begin
    values = watch.end(overflow=None)        # {"loss_scale": 1024.0, "overflow": 1.0}
"""

from __future__ import annotations

import math
from typing import Any

from ...findings import Finding
from .probes import loss_scale

__all__ = ["ScaleWatch", "loss_scale_findings"]


class ScaleWatch:
    """The scale a step ran with (read at its begin) and its overflow (see module doc)."""

    def __init__(self) -> None:
        self.source: Any = None
        self.before = math.nan
        self.warned_outputs = False  # the callback's one "several scalars" warning
        self._of: tuple[int, int] | None = None  # (train network, scaler) the source is of

    def begin(self, train_network: Any, scaler: Any) -> None:
        # Model.train with a dynamic manager: the train cell's scale_sense Parameter is the
        # live scale (the manager keeps its initial value); else the manager / amp scaler.
        # Resolved once per pair (a Cell attribute lookup costs ~15 µs, every step).
        key = (id(train_network), id(scaler))
        if key != self._of:
            self._of = key
            sense = getattr(train_network, "scale_sense", None) if train_network is not None \
                else None
            self.source = sense if hasattr(sense, "asnumpy") else scaler
        self.before = loss_scale(self.source) if self.source is not None else math.nan

    def end(self, overflow: bool | None) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.before == self.before:
            out["loss_scale"] = self.before
            after = loss_scale(self.source)
            if overflow is None and after == after:
                overflow = after < self.before
        if overflow is not None:
            out["overflow"] = 1.0 if overflow else 0.0
        return out


def loss_scale_findings(manager: Any, optimizer: Any, device_target: str,
                        rank: int | None = None) -> list[Finding]:
    """A loss-scale manager that cannot work on ``device_target`` or disagrees with the
    optimizer's ``loss_scale`` (MindSpore's rules: ``mindspore.train.amp``,
    ``nn.Optimizer(loss_scale=...)``)."""
    if manager is None:
        return []
    out: list[Finding] = []
    name = type(manager).__name__
    get_update = getattr(manager, "get_update_cell", None)
    dynamic = callable(get_update) and get_update() is not None
    if dynamic and device_target == "CPU":
        out.append(Finding(
            category="loss_scale", severity="critical", rank=rank,
            rule="integration.loss_scale_device",
            message=(f"{name} updates the scale in the graph, which MindSpore does not "
                     "support on CPU (Model raises 'Only loss_scale_manager=None or "
                     "FixedLossScaleManager(drop_overflow_update=False) are supported')"),
            recommendation=("on CPU use FixedLossScaleManager(S, drop_overflow_update=False) "
                            "with the optimizer's loss_scale=S, or no manager")))
    opt_scale = getattr(optimizer, "loss_scale", None)
    drop = getattr(manager, "get_drop_overflow_update", lambda: True)()
    fixed = loss_scale(manager)
    if not dynamic and not drop and isinstance(opt_scale, (int, float)) \
            and fixed == fixed and not math.isclose(float(opt_scale), fixed):
        out.append(Finding(
            category="loss_scale", severity="critical", rank=rank,
            rule="integration.loss_scale_mismatch",
            message=(f"{name} scales the loss by {fixed:g} but the optimizer divides the "
                     f"gradients by its loss_scale={float(opt_scale):g}: every update is "
                     f"{fixed / float(opt_scale):g}x what it should be"),
            evidence={"manager_loss_scale": fixed, "optimizer_loss_scale": float(opt_scale)},
            recommendation=(f"pass loss_scale={fixed:g} to the optimizer (MindSpore needs "
                            "the two equal when drop_overflow_update=False)")))
    return out
