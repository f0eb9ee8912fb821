"""Small readers used by the zero-code instrumentation's state (torch passed in, not imported).

Each turns framework state into plain values: the rank from the environment, device
phase times from CUDA event pairs, the gradient norm as a device tensor (read later, so
no host synchronisation now), the GradScaler scale, a batch's shape for run.json.
"""

from __future__ import annotations

import math
import os
from typing import Any

from . import ddp

_NAN = math.nan


def scalar(value: Any) -> float:
    if value is None:
        return _NAN
    try:
        return float(value)
    except Exception:
        return _NAN


def env_rank() -> int:
    for var in ("RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        v = os.environ.get(var, "").strip()
        if v.isdigit():
            return int(v)
    return 0


def device_phases(marks: list[tuple[str, Any, Any]]) -> dict[str, float]:
    """Seconds per phase from CUDA event pairs (``elapsed_time`` is in milliseconds)."""
    out: dict[str, float] = {}
    for phase, start, end in marks:
        out[phase] = out.get(phase, 0.0) + float(start.elapsed_time(end)) / 1000.0
    return out


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


def cross_row(d: Any, comm: ddp.CommStep, forward: float, backward: float
               ) -> dict[str, float]:
    exposed = _NAN if math.isnan(comm.exposed_s) else comm.exposed_s
    return {
        "step_time_s": d.t_end - d.t_start, "data_wait_s": d.data_wait,
        "forward_s": forward, "backward_s": backward, "optimizer_s": d.optimizer,
        "comm_s": comm.total_s, "comm_exposed_s": exposed,
        "compute_s": forward + backward + d.optimizer,
    }
