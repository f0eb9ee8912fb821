"""Thin MindSpore layer: reads framework state and hands plain numbers to the core. Two
ways in, one session underneath (:func:`make_session`).

``Model.train``::

    from stepscope.integrations.mindspore import StepscopeCallback
    cb = StepscopeCallback("runs/exp1", profile_steps=(5, 7), cross_rank_every=50)
    model.train(epochs, dataset, callbacks=[cb], dataset_sink_mode=False)

Custom loops on ``mindspore.value_and_grad`` (:class:`LoopRecorder`)::

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
The step hooks take only the clock, the loss, the batch's counts and the scale; the rows
are made in batches off the step path (:mod:`.deferred`), and the FLOPs are counted once
after the first step (:mod:`.autoflops`). Cross-rank medians are exchanged through the
run directory every N steps (see ``crossrank``). Importing this module imports MindSpore
(the callback subclasses ``mindspore.train.Callback``); ``import stepscope`` never does.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from time import perf_counter
from typing import Any, TypeVar

import mindspore as ms
from mindspore.train import Callback

from ...findings import Finding
from ...record.losscheck import ambiguous_loss, find_loss
from ...record.recorder import Recorder
from ...record.session import StepSession
from . import autoflops
from .async_reads import BatchCounter, LrReader, shared_sampler
from .autoflops import forward_of_model
from .deferred import StepBatch, UsageFeed
from .loss_scale import ScaleWatch, loss_scale_findings
from .probes import (
    MEM_SOURCE,
    batch_counts,
    device_info,
    environment,
    execution_mode,
    function_modes,
    grad_norm,
    loss_scale,
    model_fingerprint,
    optimizer_lr,
    peak_flops,
    rank_and_world,
    to_float,
)
from .profile import ProfileCapture

__all__ = [
    "StepscopeCallback", "LoopRecorder", "environment", "device_info", "model_fingerprint",
    "optimizer_lr", "loss_scale", "grad_norm", "batch_counts", "rank_and_world", "to_float",
    "peak_flops",
    "MEM_SOURCE",
]

T = TypeVar("T")
def make_session(run_dir: str | os.PathLike[str], meta: dict[str, Any] | None, net: Any,
                 optimizer: Any, profile_steps: tuple[int, int] | None, every: int,
                 loss_source: str, *, rank: int | None = None,
                 alerts: str | os.PathLike[str] | None = None,
                 sync_every: int = 0, loss_advice: str = "",
                 cells: tuple[Any, Any] = (None, None),
                 usage: UsageFeed | None = None) -> StepSession:
    """A session for this rank: run.json facts, profiler capture (``cells``: the network
    and optimizer its PyNative phase marks hook), cross-rank view and, with
    ``sync_every`` > 0, ``mindspore.runtime.synchronize`` at the phase boundaries of every
    N-th step (MindSpore dispatches asynchronously, even on CPU). ``usage``: the
    recorder's CPU-time source (see :mod:`.deferred`)."""
    m = _base_meta(meta, net, optimizer)
    r, world = rank_and_world()
    r = r if rank is None else rank
    rec = Recorder(run_dir, meta=m, rank=r, alerts=alerts, usage=usage)
    capture = ProfileCapture(rec.run, profile_steps, r, world) if profile_steps else None
    if capture is not None:  # PyNative phase marks (network, optimizer): see profile.py
        capture.attach(*cells)
    sync = getattr(getattr(ms, "runtime", None), "synchronize", None) if sync_every else None
    s = StepSession(rec, loss_source=loss_source, capture=capture,
                    mem_probe=shared_sampler(), sync=sync, sync_every=sync_every,
                    loss_advice=loss_advice)
    s.enable_cross_rank(world=world, every=every)  # through the run dir, no AllGather
    return s


def crash_event(core: StepSession, error: str | None) -> dict[str, Any]:
    """The per-rank ``crash`` event `stepscope run` names the first failing rank from."""
    return {"type": "crash", "rank": core.rank, "error": error, "wall_time_s": time.time(),
            "step": core.step}


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
        keep_open: record later ``Model.train`` calls into the same run (the records are
            then closed by :meth:`close`, as ``stepscope run`` does at exit).

    An exception raised inside ``Model.train`` (a callback's "loss is NAN or INF", a
    shape error) closes the run ``failed`` with it.
    """

    def __init__(self, run_dir: str | os.PathLike[str], *, meta: dict[str, Any] | None = None,
                 profile_steps: tuple[int, int] | None = None, cross_rank_every: int = 0,
                 tokens_per_sample: float | None = None, rank: int | None = None,
                 alerts: str | os.PathLike[str] | None = None, keep_open: bool = False) -> None:
        super().__init__()
        self.run_dir = run_dir
        self._args = (meta, profile_steps, cross_rank_every, rank)
        self.alerts = alerts
        self.tokens_per_sample = tokens_per_sample
        self.keep_open = keep_open
        self.check_scale = True  # loss-scale set-up findings at train begin
        self.core: StepSession | None = None
        self.scale = ScaleWatch()
        self._lr: LrReader | None = None
        self._counts = BatchCounter(tokens_per_sample)
        self._scale_src: tuple[Any, Any] | None = None  # (train network, manager) with a scale
        self._loss_at: int | None = None  # 0: the outputs are the loss; 1: their first
        self._last_cur = 0
        self._batch: StepBatch | None = None  # steps recorded off the hot path (batched)
        self._t_begin = self._lr_begin = 0.0
        self._extra_begin = True  # the begin hook does more than take the clock
        self._count_flops = False  # FLOPs still to count after the first step

    def on_train_begin(self, run_context: Any) -> None:
        p = run_context.original_args()
        if self.core is not None:  # a later Model.train call of a kept-open run
            self._restart()
            self._last_cur = int(p.get("cur_step_num", 0) or 0)
            return
        self._last_cur = int(p.get("cur_step_num", 0) or 0)  # >0 when resuming
        meta, profile_steps, every, rank = self._args
        m = _with_config(meta, stepscope_integration="mindspore Model.train callback")
        m.setdefault("baseline", {}).setdefault("execution_mode", execution_mode())
        net, opt = p.get("network"), p.get("optimizer")
        self._lr = LrReader(opt)
        # Read once: a Cell attribute costs ~15 µs a step.
        train_net = p.get("train_network")
        manager = p.get("loss_scale_mananger")  # (MindSpore's spelling)
        if manager is not None or hasattr(train_net, "scale_sense"):
            self._scale_src = (train_net, manager)
        feed = UsageFeed() if not profile_steps else None
        self.core = make_session(self.run_dir, m, net, opt, profile_steps, every,
                                 "the training network's outputs", rank=rank,
                                 alerts=self.alerts, loss_advice=_CALLBACK_LOSS_ADVICE,
                                 cells=(train_net, None), usage=feed)
        # Profiled runs keep the per-step path: the capture starts and stops at steps.
        self._batch = StepBatch(self.core, feed, self._finish) if feed is not None else None
        self._extra_begin = self._scale_src is not None or self._batch is None or \
            self._lr.asks
        env = (meta or {}).get("environment", {})
        self._count_flops = self.core.rank == 0 and not any(
            k in env for k in ("flops_per_token", "flops_per_sample"))  # the user's win
        manager = manager if self.check_scale else None
        for f in loss_scale_findings(manager, opt, str(ms.get_context("device_target")),
                                     self.core.rank):
            self.core.rec.run.append_event({"type": "finding", **f.to_dict()})

    def _restart(self) -> None:
        if self._batch is not None:
            self._batch.restart()
        elif self.core is not None:
            self.core.restart_wait()

    def on_train_epoch_begin(self, run_context: Any) -> None:
        if self.core is not None:
            self._restart()

    def on_train_step_begin(self, run_context: Any) -> None:
        self._t_begin = perf_counter()  # data wait: since the previous step's end
        if self._extra_begin:
            p = run_context.original_args()
            if self._scale_src is not None:
                self.scale.begin(*self._scale_src)
            if self._lr is not None and self._lr.asks:  # a schedule cell: before the update
                self._lr_begin = self._lr(int(p.get("cur_step_num", 0) or 0) - 1)
            if self._batch is None:
                assert self.core is not None
                self.core.begin()

    def on_train_step_end(self, run_context: Any) -> None:
        # The hot path: the loss (its read waits for the step), the clock, the batch's
        # counts, the scale; the row is made later, off it (_finish, see .deferred).
        p = run_context.original_args()
        outputs = p.get("net_outputs")
        loss, what = self._loss(outputs)
        t = perf_counter()
        scale = self._scale_values(outputs) if self._scale_src is not None or (
            type(outputs) is tuple and len(outputs) == 3) else None
        raw = (self._counts(p.get("train_dataset_element")), loss, what,
               int(p.get("cur_step_num", 0) or 0), scale, self._lr_begin)
        if self._batch is not None:
            self._batch.add(self._t_begin, t, raw)
        else:
            assert self.core is not None
            tokens, samples, loss, values, missing = self._finish(raw)
            self.core.count(tokens, samples)
            self.core.end(values=values, loss=loss, missing_loss=missing)
        if self._count_flops and self._outside_capture():  # once, off every step's path
            self._count_flops = False
            self._attach_flops(p)

    def _outside_capture(self) -> bool:
        """No profiler window holds the step just ended or the next (the count's forward
        must not be in a trace)."""
        cap = self.core.capture if self.core is not None else None
        n = self.core.step if self.core is not None else 0
        return cap is None or not (cap.active(n - 1) or cap.active(n))

    def _attach_flops(self, p: Any) -> None:
        """FLOPs of the forward network on the first batch (see :mod:`.autoflops`)."""
        assert self.core is not None
        net, why = forward_of_model(p.get("network"), p.get("loss_fn"))
        element = p.get("train_dataset_element")
        first = element[0] if isinstance(element, (tuple, list)) and element else element
        if net is None:
            autoflops.note(self.core, why)
        else:
            autoflops.attach(self.core, net, (first,), self.tokens_per_sample)
        if self._batch is not None:
            self._batch.prev_end = perf_counter()  # the count is tool time, not data wait
        else:
            self.core.restart_wait()

    def _scale_values(self, outputs: Any) -> dict[str, float]:
        overflow = None
        if isinstance(outputs, (tuple, list)) and len(outputs) == 3:
            # TrainOneStepWithLossScaleCell: (loss, overflow, scale after the update)
            try:
                overflow = bool(to_float(outputs[1]))
            except (TypeError, ValueError):
                pass
        return self.scale.end(overflow)

    def _finish(self, raw: Any) -> tuple[float, float, float | None, dict[str, float], str]:
        """A step's row contents from what its hooks took (in step order)."""
        (tokens, samples), loss, what, cur, scale, lr_begin = raw
        values = dict(scale) if scale else {}
        if cur - self._last_cur > 1:  # dataset sink mode: one callback per sink of steps
            values["steps_per_record"] = float(cur - self._last_cur)
        self._last_cur = cur
        if self._lr is not None:
            values["lr"] = lr_begin if self._lr.asks else self._lr(cur - 1)
        missing = f"were {what}, which hold no scalar loss" if loss is None else ""
        return tokens, samples, loss, values, missing

    def _loss(self, outputs: Any) -> tuple[float | None, str]:
        """The loss, found once by :func:`find_loss` and then read where it was found
        (a dtype read costs ~15 µs a step in a callback, the value ~3 µs)."""
        at = self._loss_at
        if at is not None:
            try:
                return float(outputs if at == 0 else outputs[0]), ""
            except (TypeError, ValueError, IndexError, RuntimeError):
                self._loss_at = None  # the outputs changed shape: look again
        loss, what = find_loss(outputs, to_float)
        if loss is not None:
            self._loss_at = 0 if not isinstance(outputs, (tuple, list)) else 1
        self._check_outputs(outputs)
        return loss, what

    def _check_outputs(self, outputs: Any) -> None:
        """Once: outputs whose first scalar may not be the loss (a warning event)."""
        if self.scale.warned_outputs:
            return
        self.scale.warned_outputs = True
        message = ambiguous_loss(outputs)
        if message is not None:
            assert self.core is not None
            self.core.rec.run.append_event({"type": "warning", "rank": self.core.rank,
                                            "message": message})

    def flush(self) -> None:
        """Record the steps still pending (see :mod:`.deferred`)."""
        if self._batch is not None:
            self._batch.drain()

    def on_train_end(self, run_context: Any) -> None:
        if self.core is None:
            return
        self.flush()
        if self.core.step == 0:  # the field report's "the callback hook never fired"
            self.core.rec.run.append_event({"type": "finding", **Finding(
                category="logging", severity="critical", rank=self.core.rank,
                message=("no steps recorded: Model.train ran but the callback's step hooks "
                         "never fired; every per-step curve of this run would be empty"),
                recommendation=("pass the callback in Model.train(callbacks=[...]) and check "
                                "that the dataset is not empty"),
                rule="integration.no_steps").to_dict()})
        if not self.keep_open:
            self.close()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: Any) -> None:
        """Model.train's callback manager exits: an exception ends the run ``failed``."""
        if et is not None and self.core is not None and not self.core.rec._closed:
            self.flush()
            error = f"{et.__name__}: {e}"
            self.core.rec.run.append_event(crash_event(self.core, error))
            self.close("failed", error)

    def close(self, status: str = "finished", error: str | None = None) -> None:
        if self.core is not None:
            self.flush()
            self.core.close(status, error)


# The callback reads the loss only from the network's outputs: it has no log() to point at.
_CALLBACK_LOSS_ADVICE = ("return the loss as the training cell's first output, as "
                         "TrainOneStepCell does: StepscopeCallback reads it from the "
                         "network's outputs")


def _with_config(meta: dict[str, Any] | None, **config: Any) -> dict[str, Any]:
    m = {k: dict(v) if isinstance(v, dict) else v for k, v in (meta or {}).items()}
    m.setdefault("config", {}).update(config)
    return m


class LoopRecorder:
    """Recorder for custom loops built on ``mindspore.value_and_grad`` (see module doc).

    Phases: ``forward_backward`` (value_and_grad runs both in one call), ``comm`` (e.g.
    a ``DistributedGradReducer``), ``optimizer``; any other name becomes ``<name>_s``.
    Every ``sync_every``-th step (default 10; 0: never) is synchronised at its phase
    boundaries (``mindspore.runtime.synchronize``) and marked ``synced``: MindSpore
    dispatches asynchronously, so an unsynced phase shows where the host waited.
    ``compiled``: whether the step functions run under ``@jit``, for run.json's
    ``baseline.execution_mode`` (``compare`` names a difference): True/False, or the step
    functions themselves (``compiled=[train_step]``), each found compiled or not
    (``config.function_modes``: ``{"train_step": "jit"}``); default: the context's mode.
    """

    def __init__(self, run_dir: str | os.PathLike[str], *, network: Any = None,
                 optimizer: Any = None, scaler: Any = None, meta: dict[str, Any] | None = None,
                 profile_steps: tuple[int, int] | None = None, cross_rank_every: int = 0,
                 tokens_per_sample: float | None = None, rank: int | None = None,
                 alerts: str | os.PathLike[str] | None = None, sync_every: int = 10,
                 compiled: bool | Callable[..., Any] | Iterable[Callable[..., Any]] | None
                 = None) -> None:
        m = _with_config(meta, stepscope_integration="mindspore custom loop (LoopRecorder)",
                         phase_note=("forward_backward_s: mindspore.value_and_grad runs "
                                     "forward and backward in one call; the host cannot time "
                                     "them apart (profile_steps splits them by op name)"),
                         sync_every=sync_every)
        if compiled is not None and not isinstance(compiled, bool):
            functions = [compiled] if callable(compiled) else list(compiled)
            modes = function_modes(functions)
            m["config"]["function_modes"] = modes
            compiled = "jit" in modes.values()
        m.setdefault("baseline", {}).setdefault("execution_mode", execution_mode(compiled))
        self.core = make_session(run_dir, m, network, optimizer, profile_steps,
                                 cross_rank_every, "the custom loop", rank=rank, alerts=alerts,
                                 sync_every=sync_every, cells=(network, optimizer))
        self.optimizer, self.scaler = optimizer, scaler
        self._lr = LrReader(optimizer)
        self.tokens_per_sample = tokens_per_sample
        self.scale = ScaleWatch()
        self._loss: float | None = None
        self._overflow: bool | None = None

    @property
    def recorder(self) -> Recorder:
        return self.core.rec

    def wrap_loader(self, loader: Iterable[T]) -> Iterator[T]:
        return self.core.wrap_loader(loader)

    @contextmanager
    def step(self, batch: Any = None, tokens: float | None = None,
             samples: float | None = None) -> Iterator[StepSession]:
        """One step; the handle's ``phase(name)`` times a phase."""
        t, s = batch_counts(batch, self.tokens_per_sample) if batch is not None \
            else (math.nan, math.nan)
        core = self.core
        core.begin(wait_s=core.loader_wait_s)
        core.count(t if tokens is None else tokens, s if samples is None else samples)
        core.log(lr=self._lr(core.step))
        self.scale.begin(None, self.scaler)  # the scale this step runs with
        self._loss = self._overflow = None
        try:
            yield core
        except BaseException:
            core.end()  # keep the failed step's times; no loss check
            raise
        core.end(values=self.scale.end(self._overflow), loss=self._loss,
                 missing_loss="held no loss (LoopRecorder.log(loss=...) was not called)")

    def log(self, *, loss: Any = None, grads: Iterable[Any] | None = None,
            overflow: Any = None, **values: float) -> None:
        """Loss (tensor or float), gradients (their global norm is logged), overflow flag
        (default: the gradients' norm is not finite, or the loss scale backed off)."""
        if loss is not None:
            self._loss = to_float(loss)
        if grads is not None:
            norm = grad_norm(grads)
            self.core.log(grad_norm=norm)
            if overflow is None and self._overflow is None:
                self._overflow = not math.isfinite(norm)
        if overflow is not None:
            self._overflow = bool(to_float(overflow))
        self.core.log(**{k: float(v) for k, v in values.items()})

    def close(self, status: str = "finished", error: str | None = None) -> None:
        self.core.close(status, error)

    def __enter__(self) -> LoopRecorder:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: Any) -> None:
        if et is None:
            self.close()
            return
        error = f"{et.__name__}: {e}"
        self.core.rec.run.append_event(crash_event(self.core, error))
        self.close("failed", error)
