"""Recorder for custom MindSpore loops built on ``mindspore.value_and_grad``.

Example::

    rec = LoopRecorder("runs/exp1", network=net, optimizer=opt, scaler=scaler)
    for x, y in rec.wrap_loader(dataset.create_tuple_iterator()):
        with rec.step(x) as s:
            with s.phase("forward_backward"):       # value_and_grad fuses the two
                (loss, grads) = train_fn(x, y)
            with s.phase("optimizer"):
                opt(grads)
            rec.log(loss=loss, grads=grads)
    rec.close()

What it measures is the callback module's (:mod:`.callback`), with ``forward_backward_s``
for the fused value_and_grad call.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from ...record.recorder import Recorder
from ...record.session import StepSession
from .async_reads import LrReader
from .callback import _with_config, crash_event, make_session
from .loss_scale import ScaleWatch
from .probes import batch_counts, execution_mode, function_modes, grad_norm, to_float

__all__ = ["LoopRecorder"]

T = TypeVar("T")


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
