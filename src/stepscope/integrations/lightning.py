"""Lightning ``Callback``: one step row per optimizer step (``trainer.global_step``).

Example::

    import lightning.pytorch as pl
    from stepscope.integrations.lightning import StepscopeCallback

    trainer = pl.Trainer(max_steps=100, callbacks=[StepscopeCallback("runs/lit")])
    trainer.fit(model, datamodule=dm)

What each column is made of:

* ``data_wait_s``: from the previous batch's ``on_train_batch_end`` to
  ``on_train_batch_start`` (the loop fetching the batch), summed over micro-batches;
* ``forward_s``: ``on_train_batch_start`` to ``on_before_backward`` (``training_step``
  including the loss); ``backward_s``: ``on_before_backward`` to ``on_after_backward``;
  ``optimizer_s``: ``on_before_optimizer_step`` to ``on_train_batch_end`` (the update and
  ``zero_grad``);
* ``tokens``/``samples``: the batch (first 2-D integer tensor = token ids), summed over
  micro-batches; ``loss``: the value ``backward`` ran on (Lightning divides it by
  ``accumulate_grad_batches``), summed; ``lr`` and ``grad_norm`` (before clipping, which
  Lightning applies after ``on_before_optimizer_step``) from the first optimizer.

Each validation's own metrics (``val_loss`` ..., read at ``on_validation_end``; not the
sanity check) become an eval event at the number of steps recorded before it, read by
``compare``'s quality ledger (:mod:`.evals`); ``trainer.validate()`` after ``fit`` too.

The callback registers nothing on the model or optimizer (Lightning calls it); one
instance used for several ``fit`` calls writes one run, its steps numbered on.

Under ``stepscope run`` this callback does nothing (the zero-code hooks record already).
"""

from __future__ import annotations

import os
from typing import Any

from lightning.pytorch import Callback

from ..record.session import StepSession
from ..rundir.store import RunDir
from . import evals
from .torch import auto as torch_auto
from .torch.callback import Losses, default_run_dir, open_session, run_meta
from .torch.probes import batch_counts, grad_norm

__all__ = ["StepscopeCallback"]

# Lightning's precision flags in run.json's vocabulary (schema.BASELINE_FIELDS["precision"]).
_PRECISION = {"32-true": "fp32", "32": "fp32", "64-true": "fp64", "bf16-mixed": "bf16-mixed",
              "16-mixed": "fp16-mixed", "bf16-true": "bf16", "16-true": "fp16"}


class StepscopeCallback(Callback):
    """Feeds a :class:`~stepscope.record.session.StepSession` from Lightning hooks (module doc)."""

    def __init__(self, run_dir: str | os.PathLike[str] | None = None, name: str = "",
                 alerts: str | os.PathLike[str] | None = None) -> None:
        self.run_dir = str(run_dir) if run_dir is not None else default_run_dir("lightning")
        self.name = name
        self.alerts = alerts  # an alert file (stepscope.alerts); default $STEPSCOPE_ALERTS
        self.pc: StepSession | None = None
        self.losses = Losses()
        self._last_global_step = 0
        self._t_batch_end: float | None = None
        self._t_val: float | None = None  # on_validation_start's clock
        self._lr: float | None = None
        self._norm: float | None = None
        self._run: RunDir | None = None  # the last session's run (validations after it)
        self._steps = 0  # steps that session recorded
        self.disabled = torch_auto.active()

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.disabled:
            return
        # One session per fit, numbered on from the previous fit's steps; nothing of a
        # fit that ended without on_train_end / on_exception is carried over.
        self._close("failed", "fit ended without on_train_end")
        self.losses.take()
        self._t_batch_end = None
        self._t_val = None
        self._lr = self._norm = None
        opt = trainer.optimizers[0] if trainer.optimizers else None
        seed = os.environ.get("PL_GLOBAL_SEED")
        meta = run_meta(pl_module, opt, "lightning.StepscopeCallback", {
            "grad_accum": int(trainer.accumulate_grad_batches),
            "num_devices": int(trainer.world_size),
            "precision": _PRECISION.get(str(trainer.precision), str(trainer.precision)),
            "seed": int(seed) if seed and seed.lstrip("-").isdigit() else None,
            "parallel_strategy": type(trainer.strategy).__name__,
        })
        if self.name:
            meta["name"] = self.name
        self.pc = open_session(self.run_dir, meta, int(trainer.global_rank), pl_module.device,
                               alerts=self.alerts, start_step=self._steps)
        self._run = self.pc.rec.run
        self._last_global_step = int(trainer.global_step)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        pc = self.pc
        if pc is None:
            return
        if pc.in_step and self._t_batch_end is not None:  # next micro-batch of the step
            pc.add_time("data_wait", pc.clock() - self._t_batch_end)
        pc.begin()
        pc.count(*batch_counts(batch))
        pc.mark()

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        if self.pc is not None:
            self.pc.lap("forward")
            self.losses.add(loss)

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        if self.pc is not None:
            self.pc.lap("backward")

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        pc = self.pc
        if pc is None:
            return
        try:
            groups = optimizer.param_groups
            self._lr = float(groups[0]["lr"])
            self._norm = grad_norm(p for g in groups for p in g["params"])
        except Exception:
            self._lr = self._norm = None
        pc.mark()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        pc = self.pc
        if pc is None:
            return
        if int(trainer.global_step) > self._last_global_step:  # the optimizer stepped
            self._last_global_step = int(trainer.global_step)
            pc.lap("optimizer")
            pc.end(values={"lr": self._lr, "grad_norm": self._norm}, loss=self.losses.take())
            self._t_batch_end = None
        else:
            self._t_batch_end = pc.clock()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._t_val = self.pc.clock() if self.pc is not None else None

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        pc, t0 = self.pc, self._t_val
        try:  # validation between steps: the next step's eval_s, not its data wait
            if pc is not None and t0 is not None and not pc.in_step:
                pc.between_steps("eval_s", pc.clock() - t0)
        except Exception:
            pass
        self._t_val = None
        run = self._run
        if run is None or int(getattr(trainer, "global_rank", 0)) != 0:
            return
        try:
            step = self.pc.step if self.pc is not None else self._steps
            event = evals.eval_event(step, evals.lightning_metrics(trainer),
                                     "Lightning on_validation_end")
            if event is not None:
                run.append_event(event)
        except Exception:  # measuring must never break training
            pass

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._close("finished", None)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._close("failed", f"{type(exception).__name__}: {exception}")

    def _close(self, status: str, error: str | None) -> None:
        if self.pc is not None:
            self._steps = self.pc.step
            self.pc.close(status=status, error=error)
            self.pc = None
