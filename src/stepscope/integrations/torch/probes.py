"""Thin PyTorch layer: reads framework state and hands plain numbers to the core.

Example::

    import stepscope
    from stepscope.integrations import torch as sst

    probe, mem_source = sst.memory_probe(device)
    rec = stepscope.Recorder(run_dir, meta={"environment": {**sst.environment(device),
                                                           "mem_source": mem_source}},
                             sync=sst.sync_fn(device))
    for x, y in rec.wrap_loader(loader):
        tokens, samples = sst.batch_counts(x)
        with rec.step(tokens=tokens, samples=samples) as s:
            ...
            peak, alloc = probe()
            s.log(loss=loss.item(), grad_norm=sst.grad_norm(model.parameters()),
                  mem_peak_bytes=peak, mem_alloc_bytes=alloc)

torch is imported lazily so ``import stepscope`` never needs it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable
from typing import Any

from ...calc import hardware
from ...record.host import (
    code_version,
    cpu_model_name,
    cpu_peak_here,
    host_environment,
    process_memory_bytes,
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

MemProbe = Callable[[], tuple[float, float]]


def _torch() -> Any:
    import torch

    return torch


def grad_norm(parameters: Iterable[Any]) -> float:
    """Global L2 norm of the gradients (as ``clip_grad_norm_`` computes it, unclipped).

    Reads a scalar back from the device, so on an accelerator it synchronises: call it at
    the step's end, where the optimizer has synchronised anyway, or on sampled steps.
    """
    torch = _torch()
    grads = [p.grad for p in parameters if getattr(p, "grad", None) is not None]
    if not grads:
        return math.nan
    norms = torch._foreach_norm(grads, 2.0)
    return float(torch.linalg.vector_norm(torch.stack(norms), 2.0).item())


def memory_probe(device: Any = None) -> tuple[MemProbe, str]:
    """A function returning (peak bytes during the step, bytes in use) and its meaning.

    CUDA: the caching allocator's ``max_memory_allocated`` since the previous call (the
    peak is reset each call), i.e. the tensor peak of the step. Anything else: the
    process peak RSS from /proc (lifetime high-water mark) — ``torch.cuda.*`` stats are
    never used on a CPU build, where they silently return 0.
    """
    torch = _torch()
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda" and torch.cuda.is_available():
        def cuda_probe() -> tuple[float, float]:
            peak = float(torch.cuda.max_memory_allocated(dev))
            alloc = float(torch.cuda.memory_allocated(dev))
            torch.cuda.reset_peak_memory_stats(dev)
            return peak, alloc

        return cuda_probe, "cuda allocator max_memory_allocated per step (tensors only)"
    return process_memory_bytes, "process peak RSS (VmHWM from /proc/self/status, lifetime)"


def sync_fn(device: Any = None) -> Callable[[], None] | None:
    """Device synchronisation for sampled phase timing; None on CPU (nothing to wait for)."""
    torch = _torch()
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda" and torch.cuda.is_available():
        return lambda: torch.cuda.synchronize(dev)
    return None


def device_info(device: Any = None) -> dict[str, Any]:
    """Kind, name and count of the devices this process trains on."""
    torch = _torch()
    dev = torch.device(device) if device is not None else torch.device("cpu")
    world = 1
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        world = torch.distributed.get_world_size()
    if dev.type == "cuda" and torch.cuda.is_available():
        name = torch.cuda.get_device_name(dev)
        return {"device_kind": name, "device_name": name, "num_devices": world,
                "driver_version": f"cuda {torch.version.cuda}"}
    return {"device_kind": "cpu", "device_name": cpu_model_name(), "num_devices": world,
            "cpu_threads": torch.get_num_threads()}


def model_fingerprint(model: Any) -> dict[str, Any]:
    """Parameter count and a hash of the module tree (names, classes, shapes, dtypes)."""
    h = hashlib.sha256()
    n = 0
    for name, mod in model.named_modules():
        h.update(f"{name}:{type(mod).__name__};".encode())
    for name, p in model.named_parameters():
        n += p.numel()
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype};".encode())
    return {"num_params": int(n), "model_structure_hash": h.hexdigest()[:16],
            "model_name": type(model).__name__}


def environment(device: Any = None, code_path: str = ".") -> dict[str, Any]:
    """run.json environment: framework versions, host, device, code commit."""
    torch = _torch()
    env: dict[str, Any] = {"framework": "torch", "framework_version": torch.__version__}
    env.update(host_environment())
    info = device_info(device)
    env["device_name"] = info["device_name"]
    if "driver_version" in info:
        env["driver_version"] = info["driver_version"]
    env.update(code_version(code_path))
    return env


def batch_counts(batch: Any) -> tuple[float, float]:
    """(tokens, samples) of a batch: the first 2-D integer tensor is taken as token ids.

    Looks into dicts (``input_ids`` first), tuples and lists. Without token ids, tokens is
    NaN and samples is the leading dimension of the first tensor.
    """
    torch = _torch()
    tensors: list[Any] = []

    def collect(obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            tensors.append(obj)
        elif isinstance(obj, dict):
            if "input_ids" in obj:
                collect(obj["input_ids"])
            for v in obj.values():
                collect(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                collect(v)

    collect(batch)
    for t in tensors:
        if t.dim() == 2 and not t.is_floating_point() and not t.is_complex():
            return float(t.numel()), float(t.shape[0])
    if tensors and tensors[0].dim() >= 1:
        return math.nan, float(tensors[0].shape[0])
    return math.nan, math.nan


def grad_scaler_scale(scaler: Any) -> float:
    """Current loss scale of a ``torch.amp.GradScaler`` (NaN when disabled)."""
    try:
        if scaler is None or not scaler.is_enabled():
            return math.nan
        return float(scaler.get_scale())
    except Exception:
        return math.nan


def peak_flops_for_device(device: Any = None, dtype: str = "fp32"
                          ) -> tuple[float | None, str]:
    """Dense peak FLOP/s of one device for ``dtype`` and where the figure comes from.

    Uses the calculator's table (``stepscope.calc.hardware``). Returns ``(None, why)``
    when the device is unknown: MFU is then reported as unavailable, never guessed.
    """
    given = hardware.given_peak(dtype)
    if given is not None:
        return given.flops, given.source
    info = device_info(device)
    if info["device_kind"] == "cpu":
        entry, why = cpu_peak_here(dtype, threads=info.get("cpu_threads"))
        if entry is None:
            return None, f"{why} (CPU {info['device_name']!r}) to get MFU"
    else:
        entry = hardware.lookup_peak(info["device_name"], dtype)
        if entry is None:
            return None, (f"unknown device {info['device_name']!r} for {dtype}; "
                          "pass stepscope run --peak-tflops to get MFU")
    return float(entry.flops), str(entry.source)
