"""FLOPs of a model counted from the model itself: any network (CNN, MLP, transformer).

``forward_flops(model, args, kwargs)`` runs the model's own ``forward`` once under
``torch.utils.flop_counter.FlopCounterMode`` on *meta* tensors shaped like the first batch
(``torch.func.functional_call`` with meta copies of the parameters and buffers): PyTorch's
own per-operator formulas (matmul, convolution, scaled-dot-product attention, ...) count
it, nothing is computed, no memory is allocated and the model is left as it was. Data-
dependent models (``.item()``, ``nonzero``) cannot run on meta tensors, and models whose
modules carry forward hooks of their own (FSDP2, accelerate, DeepSpeed) or sharded
parameters are not run at all (the hooks keep state a foreign forward would change):
then None and a reason, and the run keeps the 6N convention. One data-dependent read is
common and FLOP-neutral: Hugging Face models (transformers 5's mask code) look at the
``attention_mask`` values to skip the mask; a forward that fails with it is counted again
without it (padding is computed all the same, so the FLOPs do not depend on it), and the
note says so.

The run's convention is then ``counted``: forward FLOPs x 3 (the backward taken as twice
the forward: gradients of inputs and of weights, one matmul each), per sample and, where
token ids were seen, per token; no recompute (HFU = MFU).

Example::

    fwd, why = forward_flops(model, (images,), {})
    fields = counted_fields(fwd, samples=64, tokens=None)   # run.json environment fields
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["forward_flops", "meta_like", "capture_call", "counted_fields", "CONVENTION"]

CONVENTION = "counted"
# how a forward that read its attention_mask's values was counted (module docstring)
MASK_SUFFIX = " (attention_mask left out: the model reads its values; FLOPs do not)"


def meta_like(obj: Any) -> Any:
    """``obj`` with every tensor replaced by an empty meta tensor of its shape and dtype."""
    import torch
    from torch.utils._pytree import tree_map

    return tree_map(lambda v: torch.empty_like(v, device="meta")
                    if isinstance(v, torch.Tensor) else v, obj)


def capture_call(model: Any, args: Any, kwargs: Any) -> tuple[Any, Any, Any] | None:
    """(model, meta args, meta kwargs) of a forward call, kept to count it later; None
    when the inputs cannot be copied as meta tensors (never raises: the training runs on)."""
    try:
        return model, meta_like(tuple(args)), meta_like(dict(kwargs or {}))
    except Exception:
        return None


def _inner(model: Any) -> Any:
    """The user's module under DDP (``.module``) or ``torch.compile`` (``._orig_mod``)."""
    for attr in ("_orig_mod", "module"):
        while hasattr(model, attr) and hasattr(getattr(model, attr), "parameters"):
            model = getattr(model, attr)
    return model


def _not_safe(m: Any) -> str | None:
    """Why running ``m``'s forward outside the training would change it, or None.

    A module's own forward hooks run on any call (functional_call included): FSDP2's
    unshard/reshard, accelerate's device placement and DeepSpeed's parameter fetches keep
    state in them, and a forward stepscope ran would leave that state behind for the
    script's next one (FSDP2 then mixed plain tensors with DTensors). Sharded parameters
    (DTensor, or any tensor subclass) are left alone for the same reason.
    """
    import torch

    for name, sub in m.named_modules():
        if sub._forward_pre_hooks or sub._forward_hooks:
            return f"module {name or type(sub).__name__} has forward hooks of its own"
    for name, p in m.named_parameters():
        if type(p) not in (torch.Tensor, torch.nn.Parameter):
            return f"parameter {name} is a {type(p).__name__}"
    return None


def forward_flops(model: Any, args: Any, kwargs: Any = None) -> tuple[int | None, str]:
    """(FLOPs of one forward on inputs shaped like ``args``/``kwargs``, note)."""
    import torch
    from torch.func import functional_call
    from torch.utils.flop_counter import FlopCounterMode

    m = _inner(model)
    why = _not_safe(m)
    if why:
        return None, f"not counted ({why})"
    kwargs = dict(kwargs or {})
    note = "torch.utils.flop_counter.FlopCounterMode, one forward on meta tensors"
    state = {k: torch.empty_like(v, device="meta") for k, v in
             [*m.named_parameters(), *m.named_buffers()]}

    def count(kw: dict[str, Any]) -> int:
        counter = FlopCounterMode(display=False)
        with torch.no_grad(), counter:
            functional_call(m, state, meta_like(tuple(args)), meta_like(kw))
        return int(counter.get_total_flops())

    try:
        total = count(kwargs)
    except Exception as exc:  # the model cannot run on meta tensors: not counted
        why = f"not counted ({type(exc).__name__}: {str(exc)[:120]})"
        if "attention_mask" not in kwargs:
            return None, why
        try:  # the mask's values were read (module docstring): once more without it
            total = count({k: v for k, v in kwargs.items() if k != "attention_mask"})
        except Exception:
            return None, why
        note += MASK_SUFFIX
    if total <= 0:
        return None, "not counted (FlopCounterMode saw no matmul, convolution or attention)"
    return total, note


def counted_fields(forward: int, samples: float | None, tokens: float | None,
                   masked: bool = False) -> dict[str, Any]:
    """run.json FLOPs fields of the ``counted`` convention for one micro-batch's forward
    FLOPs ``forward`` over ``samples`` samples (and ``tokens`` token ids, when seen);
    ``masked``: the forward was counted without its attention_mask (:data:`MASK_SUFFIX`)."""
    step = 3.0 * forward  # forward + backward (2 x forward)
    out: dict[str, Any] = {"counted_forward_flops": forward}
    if samples and samples > 0:
        out["flops_per_sample"] = out["hardware_flops_per_sample"] = step / samples
    if tokens and tokens > 0 and math.isfinite(tokens):
        out["flops_per_token"] = out["hardware_flops_per_token"] = step / tokens
    mask = "; " + MASK_SUFFIX.strip(" ()") if masked else ""
    out["flops_convention"] = (
        f"counted: forward FLOPs x 3 ({forward:,} forward FLOPs per micro-batch of "
        f"{samples:g} samples counted by torch.utils.flop_counter.FlopCounterMode on the "
        f"model's own forward; backward taken as 2x forward; no recompute{mask})")
    return out
