"""PyTorch adapters: probes for plain loops, the zero-code hooks (``auto``), DDP/FSDP, callbacks.

``from stepscope.integrations import torch as sst`` keeps giving the probes (``sst.grad_norm``,
``sst.memory_probe``, ...); torch itself is imported lazily.
"""

from .probes import (
    batch_counts,
    device_info,
    environment,
    grad_norm,
    grad_scaler_scale,
    memory_probe,
    model_fingerprint,
    peak_flops_for_device,
    sync_fn,
)

__all__ = [
    "grad_norm",
    "memory_probe",
    "sync_fn",
    "device_info",
    "model_fingerprint",
    "environment",
    "batch_counts",
    "peak_flops_for_device",
    "grad_scaler_scale",
]
