"""Readers of framework state for the zero-code instrumentation.

Readers turn framework state into plain values (torch is passed in, never imported): the
rank from the environment, the gradient norm as a device tensor (read later, so no host
synchronisation now), the GradScaler scale, a batch's shape for run.json, a module call's
keyword arguments.
"""

from __future__ import annotations

import math
import sys
from typing import Any

_NAN = math.nan


def scalar(value: Any) -> float:
    if value is None:
        return _NAN
    try:
        return float(value)
    except Exception:
        return _NAN


def dist_rank(torch: Any) -> int | None:
    """This process's rank in the default process group, None before the group exists."""
    d = torch.distributed
    return int(d.get_rank()) if d.is_available() and d.is_initialized() else None


def grad_norm_tensor(torch: Any, groups: Any) -> Any:
    """Global L2 norm of all gradients as a 0-d tensor (no host sync; read later)."""
    grads = [p.grad for g in groups for p in g["params"] if p.grad is not None]
    if not grads:
        return None
    norms = torch._foreach_norm(grads, 2.0)
    return torch.linalg.vector_norm(torch.stack([n.float() for n in norms]), 2.0)


def scale_of(scaler: Any) -> Any:
    try:
        if not scaler.is_enabled():
            return None
        scale = getattr(scaler, "_scale", None)  # device tensor: read later, no sync now
        return scale.detach().clone() if scale is not None else scaler.get_scale()
    except Exception:
        return None


def shape_of(obj: Any, torch: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return list(obj.shape)
    if isinstance(obj, dict):
        return {str(k): shape_of(v, torch) for k, v in list(obj.items())[:8]}
    if isinstance(obj, (list, tuple)):
        return [shape_of(v, torch) for v in list(obj)[:8]]
    return type(obj).__name__


def call_kwargs() -> dict[str, Any]:
    """Keyword arguments of the module call now in progress, read from its frame.

    Global module hooks see positional arguments only; a model called with keywords
    (Hugging Face: ``model(**batch)``) is read from ``Module._call_impl``'s frame, a few
    frames above the hook that calls this. Anything unexpected gives {} (the step then
    counts tokens from the DataLoader).
    """
    frame = sys._getframe(1)
    for _ in range(6):
        frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            return {}
        if frame.f_code.co_name == "_call_impl":
            kwargs = frame.f_locals.get("kwargs")
            return kwargs if isinstance(kwargs, dict) else {}
    return {}
