"""Calculators: pure functions, no framework imports (FLOPs/MFU, device peaks, memory, plan).

Example::

    from stepscope.calc import ModelSpec, flops_per_token, lookup_peak, mfu
    spec = ModelSpec(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                     swiglu=True, vocab=128256, seq_len=8192)
    est = flops_per_token(spec, "torchtitan")              # 57,914,449,920 FLOPs/token
    peak = lookup_peak("NVIDIA H100 80GB HBM3", "bf16")     # 989.5e12, dense
    mfu(tokens_per_s=3.2e4, flops_per_token=est.flops_per_token,
        peak_flops_per_device=peak.flops, devices=8)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cpu import CpuInfo, cpu_peak, host_cpu_peak
    from .flops import (
        CONVENTIONS,
        FlopsEstimate,
        ModelSpec,
        flops_per_token,
        hfu,
        mfu,
        tokens_per_s_from_step,
    )
    from .hardware import PeakEntry, explain_miss, lookup_peak, require_peak
    from .memory import MemoryEstimate, estimate
    from .plan import Layout, plan

__all__ = [
    "ModelSpec",
    "FlopsEstimate",
    "CONVENTIONS",
    "flops_per_token",
    "mfu",
    "hfu",
    "tokens_per_s_from_step",
    "PeakEntry",
    "lookup_peak",
    "explain_miss",
    "require_peak",
    "host_cpu_peak",
    "cpu_peak",
    "CpuInfo",
    "MemoryEstimate",
    "estimate",
    "Layout",
    "plan",
]

# name -> submodule, imported on first access (PEP 562): a caller of one calculator (the
# straggler score in every training process, the trace breakdown) does not load the device
# table, the memory model and the planner.
_LAZY = {
    "ModelSpec": "flops", "FlopsEstimate": "flops", "CONVENTIONS": "flops",
    "flops_per_token": "flops", "mfu": "flops", "hfu": "flops",
    "tokens_per_s_from_step": "flops", "PeakEntry": "hardware", "lookup_peak": "hardware",
    "explain_miss": "hardware", "require_peak": "hardware", "host_cpu_peak": "cpu",
    "cpu_peak": "cpu", "CpuInfo": "cpu", "MemoryEstimate": "memory", "estimate": "memory",
    "Layout": "plan", "plan": "plan",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
