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
