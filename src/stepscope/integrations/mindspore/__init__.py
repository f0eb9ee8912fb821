"""MindSpore adapters: the ``Model.train`` callback, the custom-loop recorder, profiler capture.

Importing this package imports MindSpore (the callback subclasses ``mindspore.train.Callback``).
"""

from .callback import (
    MEM_SOURCE,
    LoopRecorder,
    StepscopeCallback,
    batch_counts,
    device_info,
    environment,
    grad_norm,
    loss_scale,
    model_fingerprint,
    optimizer_lr,
    peak_flops,
    rank_and_world,
    to_float,
)

__all__ = [
    "StepscopeCallback", "LoopRecorder", "environment", "device_info", "model_fingerprint",
    "optimizer_lr", "loss_scale", "grad_norm", "batch_counts", "rank_and_world", "to_float",
    "peak_flops",
    "MEM_SOURCE",
]
