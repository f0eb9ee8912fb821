"""Thin MindSpore layer: reads framework state and hands plain numbers to the core.

``Model.train``::

    from stepscope.integrations.mindspore import StepscopeCallback
    cb = StepscopeCallback("runs/exp1", profile_steps=(5, 7), cross_rank_every=50)
    model.train(epochs, dataset, callbacks=[cb], dataset_sink_mode=False)

Custom loops on ``mindspore.value_and_grad``::

    rec = LoopRecorder("runs/exp1", network=net, optimizer=opt, scaler=scaler)
    for x, y in rec.wrap_loader(dataset.create_tuple_iterator()):
        with rec.step(x) as s:
            with s.phase("forward_backward"):       # value_and_grad fuses the two
                (loss, grads) = train_fn(x, y)
            with s.phase("optimizer"):
                opt(grads)
            rec.log(loss=loss, grads=grads)
    rec.close()

What is measured, per step: step time (step begin to step end plus the data wait before
it), data wait (time between the previous step's end and this step's begin: the dataset
iterator's ``next``), loss (the network outputs; a missing loss becomes the finding "no loss
recorded: ..."), lr (the optimizer's, for the step that ran), loss scale and overflow (the
loss-scale manager or ``mindspore.amp.DynamicLossScaler``), gradient norm (custom loops,
where the gradients are at hand), process peak RSS. ``Model.train`` runs forward, backward
and update as one compiled graph, so only the profiler can split them (``profile_steps``);
``value_and_grad`` fuses forward and backward, so custom loops record ``forward_backward_s``.
Cross-rank medians are gathered with ``mindspore.ops.AllGather`` every N steps
(see ``crossrank``). Importing this module imports MindSpore (the callback subclasses
``mindspore.train.Callback``); ``import stepscope`` never does.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import mindspore as ms
import numpy as np
from mindspore.train import Callback

from ...analysis.findings import Finding
from ...envinfo import code_version, cpu_model_name, cpu_peak_here, host_environment
from ...recorder import Recorder, Step
from ..common.losscheck import find_loss
from ..common.session import StepSession
from .profile import ProfileCapture

__all__ = [
    "StepscopeCallback", "LoopRecorder", "environment", "device_info", "model_fingerprint",
    "optimizer_lr", "loss_scale", "grad_norm", "batch_counts", "rank_and_world", "to_float",
    "peak_flops",
    "MEM_SOURCE",
]

T = TypeVar("T")
MEM_SOURCE = "process peak RSS (VmHWM from /proc/self/status, lifetime)"


def to_float(x: Any) -> float:
    """A MindSpore scalar tensor/parameter (or a number) as a Python float."""
    if hasattr(x, "asnumpy"):
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
    info = device_info()
    from ...calc import hardware

    if info["device_kind"] == "cpu":
        entry = cpu_peak_here(dtype)[0]  # MindSpore's CPU kernels use every allowed core
    else:
        entry = hardware.lookup_peak(info["device_name"], dtype)
    if entry is None:
        return None, (f"no peak FLOP/s known for {info['device_name']!r} ({dtype}); "
                      "pass --peak-tflops to get MFU")
    return float(entry.flops), str(entry.source)


def model_fingerprint(net: Any) -> dict[str, Any]:
    """Parameter count and a hash of parameter names, shapes and dtypes (trainable ones)."""
    h = hashlib.sha256()
    n = 0
    for p in net.trainable_params():
        shape = tuple(int(d) for d in p.shape)
        n += math.prod(shape)
        h.update(f"{p.name}:{shape}:{p.dtype};".encode())
    return {"num_params": int(n), "model_structure_hash": h.hexdigest()[:16],
            "model_name": type(net).__name__}


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


def _all_gather(values: list[float]) -> list[list[float]]:
    """Every rank's ``values`` (float32), gathered with ``mindspore.ops.AllGather``."""
    out = ms.ops.AllGather()(ms.Tensor(np.asarray([values], dtype=np.float32)))
    return [list(map(float, r)) for r in out.asnumpy()]


def _session(run_dir: str | os.PathLike[str], meta: dict[str, Any],
             profile_steps: tuple[int, int] | None, every: int, rank: int | None,
             loss_source: str) -> StepSession:
    r, world = rank_and_world()
    r = r if rank is None else rank
    rec = Recorder(run_dir, meta=meta, rank=r)
    capture = ProfileCapture(rec.run, profile_steps, r, world) if profile_steps else None
    return StepSession(rec, rank=r, world=world, loss_source=loss_source, gather=_all_gather,
                       every=every, capture=capture)


def _base_meta(meta: dict[str, Any] | None, net: Any, optimizer: Any) -> dict[str, Any]:
    m: dict[str, Any] = {k: dict(v) if isinstance(v, dict) else v
                         for k, v in (meta or {}).items()}
    env = m.setdefault("environment", {})
    for k, v in environment().items():
        env.setdefault(k, v)
    base = m.setdefault("baseline", {})
    info = device_info()
    base.setdefault("device_kind", info["device_kind"])
    base.setdefault("num_devices", info["num_devices"])
    if net is not None:
        for k, v in model_fingerprint(net).items():
            base.setdefault(k, v)
    if optimizer is not None:
        base.setdefault("optimizer", type(optimizer).__name__)
    return m


class StepscopeCallback(Callback):  # type: ignore[misc]
    """``mindspore.train.Callback`` recording every ``Model.train`` step into ``run_dir``.

    Args:
        run_dir: run directory (rank 0 writes run.json; every rank its own step file).
        meta: extra run.json content (``baseline``, ``config``...).
        profile_steps: (first, last) step indices (0-based, inclusive) to profile with the
            MindSpore profiler into ``profiles/<UTC timestamp>/``.
        cross_rank_every: gather per-rank medians every N steps (0: never).
        tokens_per_sample: tokens in one sample when the inputs are not token ids.
    """

    def __init__(self, run_dir: str | os.PathLike[str], *, meta: dict[str, Any] | None = None,
                 profile_steps: tuple[int, int] | None = None, cross_rank_every: int = 0,
                 tokens_per_sample: float | None = None, rank: int | None = None) -> None:
        super().__init__()
        self.run_dir = run_dir
        self._args = (meta, profile_steps, cross_rank_every, rank)
        self.tokens_per_sample = tokens_per_sample
        self.core: StepSession | None = None
        self._t_last = 0.0
        self._step = 0
        self._last_cur = 0

    def on_train_begin(self, run_context: Any) -> None:
        p = run_context.original_args()
        meta, profile_steps, every, rank = self._args
        m = _base_meta(meta, getattr(p, "network", None), getattr(p, "optimizer", None))
        m.setdefault("config", {})["stepscope_integration"] = "mindspore Model.train callback"
        self.core = _session(self.run_dir, m, profile_steps, every, rank,
                             "the training network's outputs")
        self._last_cur = int(getattr(p, "cur_step_num", 0) or 0)  # >0 when resuming
        self._t_last = time.perf_counter()

    def on_train_epoch_begin(self, run_context: Any) -> None:
        self._t_last = time.perf_counter()

    def on_train_step_begin(self, run_context: Any) -> None:
        assert self.core is not None
        p = run_context.original_args()
        wait = time.perf_counter() - self._t_last
        self.core.rec.add_time("data_wait", wait)
        tokens, samples = batch_counts(getattr(p, "train_dataset_element", None),
                                       self.tokens_per_sample)
        self._lr = optimizer_lr(getattr(p, "optimizer", None))
        self.core.begin(self._step, tokens, samples, wait)

    def on_train_step_end(self, run_context: Any) -> None:
        assert self.core is not None
        p = run_context.original_args()
        outputs = getattr(p, "net_outputs", None)
        values = {"lr": self._lr,
                  "loss_scale": loss_scale(getattr(p, "loss_scale_mananger", None))}
        if isinstance(outputs, (tuple, list)) and len(outputs) == 3:
            # TrainOneStepWithLossScaleCell: (loss, overflow, scale)
            try:
                values["overflow"] = float(bool(to_float(outputs[1])))
                values["loss_scale"] = to_float(outputs[2])
            except (TypeError, ValueError):
                pass
        cur = int(getattr(p, "cur_step_num", 0) or 0)
        if cur - self._last_cur > 1:  # dataset sink mode: one callback per sink of steps
            values["steps_per_record"] = float(cur - self._last_cur)
        self._last_cur = cur
        loss, what = find_loss(outputs, to_float)
        self.core.end(self._step, values, loss, f"were {what}, which hold no scalar loss")
        self._step += 1
        self._t_last = time.perf_counter()

    def on_train_end(self, run_context: Any) -> None:
        if self.core is None:
            return
        if self._step == 0:  # the field report's "the callback hook never fired"
            self.core.rec.run.append_event({"type": "finding", **Finding(
                category="logging", severity="critical", rank=self.core.rank,
                message=("no steps recorded: Model.train ran but the callback's step hooks "
                         "never fired; every per-step curve of this run would be empty"),
                recommendation=("pass the callback in Model.train(callbacks=[...]) and check "
                                "that the dataset is not empty"),
                rule="integration.no_steps").to_dict()})
        self.core.close()


class LoopRecorder:
    """Recorder for custom loops built on ``mindspore.value_and_grad`` (see module doc).

    Phases: ``forward_backward`` (value_and_grad runs both in one call), ``comm`` (e.g.
    a ``DistributedGradReducer``), ``optimizer``; any other name becomes ``<name>_s``.
    """

    def __init__(self, run_dir: str | os.PathLike[str], *, network: Any = None,
                 optimizer: Any = None, scaler: Any = None, meta: dict[str, Any] | None = None,
                 profile_steps: tuple[int, int] | None = None, cross_rank_every: int = 0,
                 tokens_per_sample: float | None = None, rank: int | None = None) -> None:
        m = _base_meta(meta, network, optimizer)
        cfg = m.setdefault("config", {})
        cfg["stepscope_integration"] = "mindspore custom loop (LoopRecorder)"
        cfg["phase_note"] = ("forward_backward_s: mindspore.value_and_grad runs forward and "
                             "backward in one call; the host cannot time them apart "
                             "(profile_steps splits them by op name)")
        self.core = _session(run_dir, m, profile_steps, cross_rank_every, rank,
                             "the custom loop")
        self.optimizer, self.scaler = optimizer, scaler
        self.tokens_per_sample = tokens_per_sample
        self._step = 0
        self._values: dict[str, float] = {}
        self._loss: float | None = None

    @property
    def recorder(self) -> Recorder:
        return self.core.rec

    def wrap_loader(self, loader: Iterable[T]) -> Iterator[T]:
        return self.core.rec.wrap_loader(loader)

    @contextmanager
    def step(self, batch: Any = None, tokens: float | None = None,
             samples: float | None = None) -> Iterator[Step]:
        t, s = batch_counts(batch, self.tokens_per_sample) if batch is not None \
            else (math.nan, math.nan)
        lr = optimizer_lr(self.optimizer)
        self._values, self._loss = {"lr": lr}, None
        wait = self.core.rec.pending_data_wait
        self.core.begin(self._step, t if tokens is None else tokens,
                        s if samples is None else samples, wait)
        try:
            yield Step(self.core.rec)
        except BaseException:
            self.core.rec.end_step()  # keep the failed step's times; no loss check
            self._step += 1
            raise
        self._values["loss_scale"] = loss_scale(self.scaler)
        self.core.end(self._step, self._values, self._loss,
                      "held no loss (LoopRecorder.log(loss=...) was not called)")
        self._step += 1

    def log(self, *, loss: Any = None, grads: Iterable[Any] | None = None,
            overflow: Any = None, **values: float) -> None:
        """Loss (tensor or float), gradients (their global norm is logged), overflow flag."""
        if loss is not None:
            self._loss = to_float(loss)
        if grads is not None:
            self._values["grad_norm"] = grad_norm(grads)
        if overflow is not None:
            self._values["overflow"] = float(bool(to_float(overflow)))
        self._values.update({k: float(v) for k, v in values.items()})

    def close(self, status: str = "finished", error: str | None = None) -> None:
        self.core.close(status, error)

    def __enter__(self) -> LoopRecorder:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: Any) -> None:
        self.close() if et is None else self.close("failed", f"{et.__name__}: {e}")

