"""Readers of MindSpore state: plain numbers and run.json facts for the session.

Everything here reads the framework (``mindspore`` is imported) and returns numbers,
strings or dicts; :mod:`.callback` feeds them to the core's
:class:`~stepscope.record.session.StepSession`.

Example::

    loss, lr = to_float(outputs[0]), optimizer_lr(opt)
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterable
from typing import Any

import mindspore as ms

from ...calc import hardware
from ...record.host import code_version, cpu_model_name, cpu_peak_here, host_environment

__all__ = [
    "environment", "device_info", "model_fingerprint", "optimizer_lr", "loss_scale",
    "grad_norm", "batch_counts", "rank_and_world", "to_float", "peak_flops",
    "MEM_SOURCE", "execution_mode",
]

MEM_SOURCE = "process peak RSS (VmHWM from /proc/self/status, lifetime)"


def to_float(x: Any) -> float:
    """A MindSpore scalar tensor/parameter (or a number) as a Python float."""
    if hasattr(x, "asnumpy"):
        try:  # one element: float() reads it in ~0.2 µs, asnumpy() copies in ~16 µs
            return float(x)
        except (TypeError, ValueError, RuntimeError):
            pass
        x = x.asnumpy()
    return float(x.reshape(-1)[0]) if hasattr(x, "reshape") else float(x)


def rank_and_world() -> tuple[int, int]:
    """(rank, group size) from ``mindspore.communication`` when initialised, else env/1."""
    try:
        from mindspore.communication import get_group_size, get_rank

        return int(get_rank()), int(get_group_size())
    except Exception:  # not initialised: a single process (or msrun env only)
        rank = os.environ.get("RANK_ID", "0")
        return (int(rank) if rank.isdigit() else 0), int(os.environ.get("RANK_SIZE", "1"))


def device_info() -> dict[str, Any]:
    target = str(ms.get_context("device_target"))
    _, world = rank_and_world()
    if target == "CPU":
        return {"device_kind": "cpu", "device_name": cpu_model_name(), "num_devices": world}
    return {"device_kind": target, "device_name": target, "num_devices": world}


def environment(code_path: str = ".") -> dict[str, Any]:
    """run.json environment: MindSpore version, mode, host, device, memory source, commit."""
    env: dict[str, Any] = {"framework": "mindspore", "framework_version": ms.__version__,
                           "mem_source": MEM_SOURCE}
    env.update(host_environment())
    env["device_name"] = device_info()["device_name"]
    mode = ms.get_context("mode")
    env["execution_mode"] = "graph" if mode == ms.GRAPH_MODE else "pynative"
    peak, source = peak_flops("fp32")
    env["peak_flops_source"] = source
    if peak:
        env["peak_flops_per_device"] = peak
    env.update(code_version(code_path))
    return env


def peak_flops(dtype: str = "fp32") -> tuple[float | None, str]:
    """Dense peak FLOP/s of one device and its source, from ``stepscope.calc``; on the CPU
    for the cores this process may run on. (None, why) when unknown: MFU then shows as
    unavailable, never guessed."""
    given = hardware.given_peak(dtype)
    if given is not None:
        return given.flops, given.source
    info = device_info()
    if info["device_kind"] == "cpu":
        entry = cpu_peak_here(dtype)[0]  # MindSpore's CPU kernels use every allowed core
    else:
        entry = hardware.lookup_peak(info["device_name"], dtype)
    if entry is None:
        return None, (f"no peak FLOP/s known for {info['device_name']!r} ({dtype}); "
                      "pass stepscope run --peak-tflops to get MFU")
    return float(entry.flops), str(entry.source)


def is_compiled(fn: Any) -> bool:
    """``fn`` runs compiled: made by ``mindspore.jit`` (through any ``functools.wraps``
    wrappers: its ``__wrapped__`` chain holds MindSpore's jit wrapper, which wraps the
    user's function and is defined in MindSpore's ``api.py``: ``mindspore/graph/api.py``
    in 2.10, ``mindspore/common/api.py`` before), or a Cell called in GRAPH_MODE."""
    if isinstance(fn, ms.nn.Cell):
        return bool(ms.get_context("mode") == ms.GRAPH_MODE)
    home = os.path.dirname(os.path.abspath(ms.__file__)) + os.sep
    seen = 0
    while fn is not None and seen < 16:
        code = getattr(fn, "__code__", None)
        if code is not None and code.co_filename.startswith(home) and \
                code.co_filename.endswith("api.py") and hasattr(fn, "__wrapped__"):
            return True
        fn, seen = getattr(fn, "__wrapped__", None), seen + 1
    return False


def function_modes(functions: Iterable[Any]) -> dict[str, str]:
    """``{name: "jit" | "graph" | "pynative"}`` for the step functions given."""
    graph = ms.get_context("mode") == ms.GRAPH_MODE
    out: dict[str, str] = {}
    for f in functions:
        name = getattr(f, "__name__", None) or type(f).__name__
        out[str(name)] = "graph" if graph else "jit" if is_compiled(f) else "pynative"
    return out


def execution_mode(compiled: bool | None = None) -> str:
    """How the step runs, for run.json's baseline (``compare`` names a difference):
    ``graph`` (GRAPH_MODE context), ``pynative+jit`` (PyNative, step functions under
    ``@jit``: ``compiled``), else ``pynative``."""
    if ms.get_context("mode") == ms.GRAPH_MODE:
        return "graph"
    return "pynative+jit" if compiled else "pynative"


def model_fingerprint(net: Any, params: Iterable[Any] | None = None) -> dict[str, Any]:
    """Parameter count and a hash of parameter names, shapes and dtypes (trainable ones;
    ``params`` instead of ``net.trainable_params()`` when only an optimizer is known)."""
    h = hashlib.sha256()
    n = 0
    for p in (net.trainable_params() if params is None else params):
        shape = tuple(int(d) for d in p.shape)
        n += math.prod(shape)
        h.update(f"{p.name}:{shape}:{p.dtype};".encode())
    out: dict[str, Any] = {"num_params": int(n), "model_structure_hash": h.hexdigest()[:16]}
    if net is not None:
        out["model_name"] = type(net).__name__
    return out


def optimizer_lr(optimizer: Any) -> float:
    """Learning rate the optimizer applies at its current global step (first group)."""
    if optimizer is None:
        return math.nan
    try:
        lr = optimizer.get_lr()
        if isinstance(lr, (tuple, list)):
            lr = lr[0]
        return to_float(lr)
    except Exception:  # exotic schedules: leave the column empty rather than break training
        return math.nan


def loss_scale(obj: Any) -> float:
    """Loss scale of a LossScaleManager (``get_loss_scale``) or ``amp`` LossScaler."""
    if obj is None:
        return math.nan
    if hasattr(obj, "asnumpy"):  # a scale Parameter (TrainOneStepWithLossScaleCell)
        return to_float(obj)
    for attr in ("get_loss_scale", "scale_value", "loss_scale_value"):
        v = getattr(obj, attr, None)
        if v is None:
            continue
        try:
            return to_float(v() if callable(v) and attr == "get_loss_scale" else v)
        except Exception:
            continue
    return math.nan


def grad_norm(grads: Iterable[Any]) -> float:
    """Global L2 norm of a tuple of gradient tensors (before clipping)."""
    gs = [g for g in grads if g is not None]
    if not gs:
        return math.nan
    sq = ms.ops.addn([ms.ops.sum(ms.ops.square(g.astype(ms.float32))) for g in gs])
    return math.sqrt(to_float(sq))


def batch_counts(batch: Any, tokens_per_sample: float | None = None) -> tuple[float, float]:
    """(tokens, samples): a 2-D integer first tensor is token ids; else samples only."""
    first = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    shape = tuple(getattr(first, "shape", ()) or ())
    if not shape:
        return math.nan, math.nan
    samples = float(shape[0])
    if tokens_per_sample is not None:
        return samples * tokens_per_sample, samples
    is_int = "int" in str(getattr(first, "dtype", "")).lower()
    return (float(math.prod(shape)) if len(shape) == 2 and is_int else math.nan), samples


