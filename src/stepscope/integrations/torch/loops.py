"""Training loops beyond ``for batch: forward, backward, optimizer.step()`` (issue 13).

The zero-code state (:class:`.state.AutoState`, passed in as ``st``) calls these for:

* evaluation between steps -- the outermost call of a no-grad / eval-mode forward of the
  trained model, and ``torch.save`` -- booked apart from the next step (:mod:`.between`),
  its losses kept (:mod:`.evalloss`); before the first training forward such forwards
  are held until it tells evaluation from probes (:mod:`.firststep`);
* closure optimizers (LBFGS, Lightning): the primary optimizer's closure is timed and its
  first evaluation gives the step's gradient norm (:mod:`.closure`);
* update loops without torch.optim (pytorch/examples word_language_model:
  ``p.data.add_(-lr * p.grad)``): while no torch.optim optimizer has stepped, a
  ``Module.zero_grad()`` after a backward closes the step, and so do an evaluation or a
  save after it and the end of the process; run.json ``config.step_boundary`` says so.

Every hook body here is guarded like those of :mod:`.hooks`: a failure is counted and
training goes on.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from . import between, closure, evalloss, firststep, frameworks
from .probes import batch_counts
from .readers import call_kwargs, grad_norm_tensor

__all__ = ["install", "eval_mark", "eval_end", "loss_end", "wrap_closure", "manual_boundary"]

# Stack entries (see .hooks): the outermost call of an evaluation forward, and a loss
# module called with autograd off right after one (its loss: .evalloss).
EVAL_MARK = 2
LOSS_MARK = 3


def install(st: Any) -> None:
    """``torch.save`` (a checkpoint between steps) and ``Module.zero_grad`` (the step
    boundary of update loops without torch.optim), patched on torch, not on objects."""
    torch = st.torch
    orig_save = torch.save

    @functools.wraps(orig_save)
    def save(*args: Any, **kwargs: Any) -> Any:
        out = orig_save(*args, **kwargs)
        try:
            on_between(st, "checkpoint")
        except Exception as exc:
            st.failed("torch.save hook", exc)
        return out

    torch.save = save
    orig_zero_grad = torch.nn.Module.zero_grad

    @functools.wraps(orig_zero_grad)
    def zero_grad(self: Any, set_to_none: bool = True) -> None:
        try:
            _on_module_zero_grad(st)
        except SystemExit:
            raise
        except Exception as exc:
            st.failed("Module.zero_grad hook", exc)
        orig_zero_grad(self, set_to_none)

    torch.nn.Module.zero_grad = zero_grad


def eval_mark(st: Any, module: Any, args: Any) -> int:
    """:data:`EVAL_MARK` when this uncounted module call starts an evaluation,
    :data:`LOSS_MARK` when it is a loss module computing the last one's loss, else 0."""
    if st.depth or st.eval_open or st.in_backward:
        return 0
    try:
        if st.closure_groups is not None and not st.closure_done:
            return 0  # inside a closure's first evaluation
        before = not st.train_params  # no training forward yet: held (.firststep)
        if between.is_eval_forward(module, st.train_params, before_training=before):
            st.eval_open = True
            st.eval_pre = before
            st.eval_key = between.first_param_id(module)
            st.eval_t0 = st.clock()
            frameworks.patch_loaded(st)
            tokens, samples = batch_counts(args)
            if math.isnan(tokens):
                tokens, samples = batch_counts(call_kwargs())  # model(**batch)
            st.eval_weight = evalloss.weight_of(tokens, samples)
            return EVAL_MARK
        if st.evals.awaiting() and evalloss.is_loss_module(module, st.torch):
            return LOSS_MARK
    except Exception as exc:
        st.failed("evaluation hook", exc)
    return 0


def eval_end(st: Any, output: Any) -> None:
    st.eval_open = False
    try:
        if st.eval_pre:
            entry = st.evals.add(evalloss.forward_loss(output), st.eval_weight)
            firststep.hold(st, st.eval_key, st.eval_t0, st.clock(), entry)
            return
        on_between(st, "eval")
        if not between.trained(st.cur):  # between steps: its loss is the evaluation's
            between.attach(st.cur, st.evals.add(evalloss.forward_loss(output),
                                                st.eval_weight))
    except Exception as exc:
        st.failed("evaluation hook", exc)


def loss_end(st: Any, output: Any) -> None:
    """A loss module ran on the last evaluation forward's output: that forward's loss."""
    try:
        st.evals.set_last(output)
    except Exception as exc:
        st.failed("evaluation loss hook", exc)


def on_between(st: Any, kind: str) -> None:
    """An evaluation forward or a checkpoint save ended: book it between steps."""
    if st.manual_steps and st.cur.micro and st.open:
        manual_boundary(st)  # a manual update loop's step ended with its update
    between.book(st.cur, kind, st.clock())


def _on_module_zero_grad(st: Any) -> None:
    if st.primary is not None or not st.cur.micro:
        return
    if not st.manual_steps:
        st.manual_steps = True
        st.config["step_boundary"] = ("Module.zero_grad() after backward: no torch.optim "
                                      "optimizer stepped (manual update)")
        st.baseline.setdefault("optimizer", "manual update (no torch.optim)")
    manual_boundary(st)


def manual_boundary(st: Any) -> None:
    """Close a step of a manual update loop (its grad norm: clip_grad_norm_'s, if any)."""
    if st.cur.grad_norm is None and st.clip_norm is not None:
        st.cur.grad_norm = st.clip_norm
    st.boundary()


def wrap_closure(st: Any, fn: Any) -> Any:
    """The primary optimizer's closure, timed (see :mod:`.closure`)."""

    def on_end(index: int, seconds: float) -> None:
        try:
            st.closure_s += seconds
            if index == 0:
                st.cur.grad_norm = st.clip_norm if st.clip_norm is not None else \
                    grad_norm_tensor(st.torch, st.closure_groups or [])
                st.closure_done = True
        except Exception as exc:
            st.failed("closure hook", exc)

    return closure.wrap(fn, st.clock, on_end)
