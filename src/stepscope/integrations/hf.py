"""Hugging Face ``Trainer`` callback: one step row per optimizer step.

Example::

    from transformers import Trainer
    from stepscope.integrations.hf import StepscopeCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[StepscopeCallback("runs/gpt2-ft")])
    trainer.train()

What each column is made of (Trainer callbacks see events, not the loop):

* ``step_time_s``: previous ``on_step_end`` to this one;
* ``data_wait_s``: previous ``on_step_end`` to ``on_step_begin`` (the Trainer fetches the
  step's micro-batches there; also logging/saving of the previous step), less an
  evaluation's own ``eval_runtime``, which is the next step's ``eval_s``;
* ``forward_s``: model forward calls (module hooks on the model); ``backward_s``: from each
  forward's end to the next forward or to ``on_pre_optimizer_step``;
  ``optimizer_s``: ``on_pre_optimizer_step`` to ``on_optimizer_step``;
* ``tokens``/``samples``: ``input_ids`` passed to the model, summed over micro-batches;
  ``loss``: the model outputs' ``loss`` over the step's micro-batches, summed when the
  Trainer passes ``num_items_in_batch`` (each is then a share of the step's mean), else
  averaged — the value the Trainer logs;
  ``lr``: first param group at ``on_pre_optimizer_step``; ``grad_norm``: the value
  ``clip_grad_norm_`` returned while training (pre-clip, every step), else the Trainer's
  own from ``on_log`` when logged, else computed at ``on_pre_optimizer_step`` (after
  clipping); run.json ``config.grad_norm_source`` says which.

Each evaluation's metrics (``on_evaluate``: ``eval_loss`` and ``compute_metrics``' results)
become an eval event at the number of steps recorded before it, read by ``compare``'s
quality ledger (:mod:`.evals`); ``trainer.evaluate()`` after training is recorded too.

Nothing stays on the model: the forward hooks are torch's global module hooks, registered
at ``on_train_begin`` and removed at ``on_train_end`` (or at the next ``train()`` when one
raised), so ``torch.save(model)`` and ``copy.deepcopy(model)`` work while training. One
instance used for several ``train()`` calls writes one run, its steps numbered on.

Under ``stepscope run`` this callback does nothing (the zero-code hooks record already).
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from transformers import TrainerCallback

from ..record.session import StepSession
from ..rundir.store import RunDir
from . import evals
from .torch import auto as torch_auto
from .torch.callback import ClipNorms, Losses, default_run_dir, open_session, run_meta
from .torch.probes import batch_counts, grad_norm
from .torch.readers import call_kwargs

__all__ = ["StepscopeCallback"]


class StepscopeCallback(TrainerCallback):
    """Feeds a :class:`~stepscope.record.session.StepSession` from Trainer events (module doc)."""

    def __init__(self, run_dir: str | os.PathLike[str] | None = None, name: str = "",
                 alerts: str | os.PathLike[str] | None = None) -> None:
        self.run_dir = str(run_dir) if run_dir is not None else default_run_dir("hf")
        self.name = name
        self.alerts = alerts  # an alert file (stepscope.alerts); default $STEPSCOPE_ALERTS
        self.pc: StepSession | None = None
        self.losses = Losses()
        self._handles: list[Any] = []
        self._optimizer: Any = None
        self._fwd_open = False
        self._after_fwd = False
        self._lr: float | None = None
        self._norm: float | None = None
        self._norm_source: str | None = None  # where grad_norm comes from (run.json)
        self._clips: ClipNorms | None = None
        self._sum_losses = False
        self._run: RunDir | None = None  # the last session's run (evaluations after it)
        self._steps = 0  # steps that session recorded
        self.disabled = torch_auto.active()

    # -- set-up / tear-down ------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       optimizer: Any = None, **kwargs: Any) -> None:
        if self.disabled or model is None:
            return
        # A train() that raised never reached on_train_end: end its session and hooks now,
        # so that this one registers its hooks once and counts every forward once.
        self._release("failed", "train() ended without on_train_end (an exception?)")
        self._reset_step()
        ga = int(getattr(args, "gradient_accumulation_steps", 1) or 1)
        world = int(getattr(args, "world_size", 1) or 1)
        micro = int(getattr(args, "per_device_train_batch_size", 0) or 0) or None
        meta = run_meta(model, optimizer, "hf.StepscopeCallback", {
            "grad_accum": ga, "micro_batch": micro, "num_devices": world,
            "global_batch": micro * ga * world if micro else None,
            "seed": getattr(args, "seed", None),
            "warmup_steps": getattr(args, "warmup_steps", None),
            "lr_schedule": str(getattr(args, "lr_scheduler_type", "")) or None,
            "vocab_size": getattr(getattr(model, "config", None), "vocab_size", None),
        })
        if self.name:
            meta["name"] = self.name
        rank = int(getattr(args, "process_index", 0) or 0)
        self.pc = open_session(self.run_dir, meta, rank, getattr(args, "device", None),
                               alerts=self.alerts, start_step=self._steps)
        self._run = self.pc.rec.run
        self._optimizer = optimizer
        self._handles = _model_hooks(self, model)
        self._clips = ClipNorms()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._release("finished", None)

    def _release(self, status: str, error: str | None) -> None:
        """Remove the hooks, put clip_grad_norm_ back, close the session (idempotent)."""
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._clips is not None:
            self._clips.close()
            self._clips = None
        if self.pc is not None:
            self._steps = self.pc.step
            self.pc.close(status=status, error=error)
            self.pc = None

    def _reset_step(self) -> None:
        self.losses.take()
        self._fwd_open = self._after_fwd = False
        self._lr = self._norm = None

    # -- model hooks (called by _model_hooks') -----------------------------------------
    def _fwd_pre(self, module: Any, args: Any, kwargs: Any) -> None:
        pc = self.pc
        if pc is None or not module.training or not pc.in_step:
            return
        try:
            if self._after_fwd:
                pc.lap("backward")  # the previous micro-batch's backward ended here
                self._after_fwd = False
            pc.mark()
            pc.count(*batch_counts(kwargs.get("input_ids", args)))
            # Trainers that pass num_items_in_batch get micro-batch losses already divided
            # by the whole step's token count: the step's loss is then their sum.
            self._sum_losses = "num_items_in_batch" in kwargs
            self._fwd_open = True
        except Exception:
            pass

    def _fwd_post(self, module: Any, args: Any, output: Any) -> None:
        pc = self.pc
        if pc is None or not self._fwd_open:
            return
        self._fwd_open = False
        self._after_fwd = True
        try:
            pc.lap("forward")
            loss = getattr(output, "loss", None)
            if loss is None and isinstance(output, dict):
                loss = output.get("loss")
            if loss is not None:
                self.losses.add(loss)
        except Exception:
            pass

    # -- trainer events ----------------------------------------------------------------
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.pc is not None and not self.pc.in_step:
            self.losses.take()  # forget losses of forwards outside a training step
            self.pc.begin()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any,
                              **kwargs: Any) -> None:
        pc = self.pc
        if pc is None:
            return
        if self._after_fwd:
            pc.lap("backward")
            self._after_fwd = False
        self._lr = self._norm = None
        opt = kwargs.get("optimizer") or self._optimizer
        try:
            groups = opt.param_groups
            self._lr = float(groups[0]["lr"])
            # the Trainer clipped already: its clip_grad_norm_ gave the pre-clip norm
            self._norm = self._clips.take() if self._clips is not None else None
            if self._norm is not None:
                self._note_norm_source("clip_grad_norm_ (pre-clip)")
            else:
                self._norm = grad_norm(p for g in groups for p in g["params"])
        except Exception:
            pass
        pc.mark()

    def _note_norm_source(self, source: str) -> None:
        if self._norm_source is None and self.pc is not None:
            self._norm_source = source
            self.pc.rec.run.update_meta(config={"grad_norm_source": source})

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.pc is not None:
            self.pc.lap("optimizer")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.pc is None:
            return
        self.pc.end(values={"lr": self._lr, "grad_norm": self._norm},
                    loss=self.losses.take("sum" if self._sum_losses else "mean"))

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
               **kwargs: Any) -> None:
        if self.pc is None or not logs or "grad_norm" not in logs or \
                self._norm_source == "clip_grad_norm_ (pre-clip)":
            return  # (the clip's own value, when seen, is already the step's)
        try:  # the Trainer's pre-clipping norm replaces ours for the step just closed
            self.pc.rec.log(grad_norm=float(logs["grad_norm"]))
            self._note_norm_source("Trainer logs")
        except Exception:
            pass

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None,
                    **kwargs: Any) -> None:
        pc = self.pc
        try:  # the Trainer timed its evaluation loop: not the next step's data wait
            if pc is not None and not pc.in_step and metrics:
                seconds = next((float(v) for k, v in metrics.items()
                                if k.endswith("_runtime")), 0.0)
                pc.between_steps("eval_s", seconds)
        except Exception:
            pass
        run = self._run
        if run is None or not getattr(state, "is_world_process_zero", True):
            return
        try:
            step = self.pc.step if self.pc is not None else self._steps
            event = evals.eval_event(step, evals.hf_metrics(metrics), "Trainer on_evaluate")
            if event is not None:
                run.append_event(event)
        except Exception:  # measuring must never break training
            pass


def _model_hooks(cb: StepscopeCallback, model: Any) -> list[Any]:
    """Forward hooks for ``model`` that leave nothing on it.

    A hook registered on the model would be stored in its ``_forward_pre_hooks`` and so
    pickled by ``torch.save(model)`` / ``copy.deepcopy(model)`` with the callback behind
    it (which holds threads and files). torch's global module hooks live in torch
    instead; these two answer for ``model``'s own calls only and hold it, and the
    callback, weakly. Keyword inputs (``model(**batch)``) come from the call's frame.
    """
    from torch.nn.modules.module import (
        register_module_forward_hook,
        register_module_forward_pre_hook,
    )

    me, target = weakref.ref(cb), weakref.ref(model)

    def pre(module: Any, args: Any) -> None:
        if module is target():
            c = me()
            if c is not None:
                c._fwd_pre(module, args, call_kwargs())

    def post(module: Any, args: Any, output: Any) -> None:
        if module is target():
            c = me()
            if c is not None:
                c._fwd_post(module, args, output)

    return [register_module_forward_pre_hook(pre), register_module_forward_hook(post)]
