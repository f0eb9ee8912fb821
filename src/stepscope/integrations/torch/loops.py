"""Training loops beyond ``for batch: forward, backward, optimizer.step()``.

The zero-code state (:class:`.state.AutoState`) owns one :class:`Loops`, which handles:

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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import between, closure, evalloss
from .clipnorm import ClipNorm
from .closure import ClosureStep
from .evalloss import EvalLosses
from .failures import Failures
from .fingerprint import Fingerprint
from .firststep import PreTraining
from .frameworks import FrameworkPatches
from .pending import OpenStep
from .phases import PhaseClock
from .probes import batch_counts
from .readers import call_kwargs, grad_norm_tensor

__all__ = ["EvalWatch", "Loops", "EVAL_MARK", "LOSS_MARK"]

# Stack entries (see .phases): the outermost call of an evaluation forward, and a loss
# module called with autograd off right after one (its loss: .evalloss).
EVAL_MARK = 2
LOSS_MARK = 3


@dataclass
class EvalWatch:
    """Evaluation detection: the trained models, and the evaluation forward running now."""

    train_params: set[int] = field(default_factory=set)  # first-parameter ids, trained
    open: bool = False  # an evaluation forward (outermost) is running
    pre: bool = False  # ... before the first training forward (held: .firststep)
    key: int | None = None  # its module's first-parameter id
    t0: float = 0.0  # its start
    weight: float = 1.0  # its loss's weight in the evaluation's mean (.evalloss)

    def trained(self, key: int) -> None:
        self.train_params.add(key)

    def start(self, pre: bool, key: int | None, t0: float, weight: float) -> None:
        self.open, self.pre, self.key, self.t0, self.weight = True, pre, key, t0, weight

    def end(self) -> None:
        self.open = False


class Loops:
    """The hook bodies for third-party loops (module docstring), over the state's parts.

    ``boundary`` closes the open step; ``optimizer_seen`` says whether a torch.optim
    optimizer has stepped (then ``Module.zero_grad`` is no boundary).
    """

    def __init__(self, torch: Any, clock: Callable[[], float], failures: Failures,
                 step: OpenStep, phase: PhaseClock, closure_step: ClosureStep,
                 clip: ClipNorm, evals: EvalLosses, pre: PreTraining, fp: Fingerprint,
                 frameworks: FrameworkPatches, boundary: Callable[[], None],
                 optimizer_seen: Callable[[], bool]) -> None:
        self.torch, self.clock, self.failures = torch, clock, failures
        self.step, self.phase, self.closure, self.clip = step, phase, closure_step, clip
        self.evals, self.pre, self.fp, self.frameworks = evals, pre, fp, frameworks
        self.boundary, self.optimizer_seen = boundary, optimizer_seen
        self.watch = EvalWatch()
        self.manual = False  # boundaries at Module.zero_grad (no torch.optim seen)

    def install(self) -> None:
        """``torch.save`` (a checkpoint between steps) and ``Module.zero_grad`` (the step
        boundary of update loops without torch.optim), patched on torch, not on objects."""
        torch = self.torch
        orig_save = torch.save

        @functools.wraps(orig_save)
        def save(*args: Any, **kwargs: Any) -> Any:
            out = orig_save(*args, **kwargs)
            try:
                self.on_between("checkpoint")
            except Exception as exc:
                self.failures.failed("torch.save hook", exc)
            return out

        torch.save = save
        orig_zero_grad = torch.nn.Module.zero_grad

        @functools.wraps(orig_zero_grad)
        def zero_grad(module: Any, set_to_none: bool = True) -> None:
            try:
                self._on_module_zero_grad()
            except SystemExit:
                raise
            except Exception as exc:
                self.failures.failed("Module.zero_grad hook", exc)
            orig_zero_grad(module, set_to_none)

        torch.nn.Module.zero_grad = zero_grad

    def eval_mark(self, module: Any, args: Any) -> int:
        """:data:`EVAL_MARK` when this uncounted module call starts an evaluation,
        :data:`LOSS_MARK` when it is a loss module computing the last one's loss, else 0."""
        watch, phase = self.watch, self.phase
        if phase.depth or watch.open or phase.in_backward:
            return 0
        try:
            if self.closure.inside_first():
                return 0  # inside a closure's first evaluation
            before = not watch.train_params  # no training forward yet: held (.firststep)
            if between.is_eval_forward(module, watch.train_params, before_training=before):
                key, t0 = between.first_param_id(module), self.clock()
                self.frameworks.patch_loaded()
                tokens, samples = batch_counts(args)
                if math.isnan(tokens):
                    tokens, samples = batch_counts(call_kwargs())  # model(**batch)
                watch.start(before, key, t0, evalloss.weight_of(tokens, samples))
                return EVAL_MARK
            if self.evals.awaiting() and evalloss.is_loss_module(module, self.torch):
                return LOSS_MARK
        except Exception as exc:
            self.failures.failed("evaluation hook", exc)
        return 0

    def eval_end(self, output: Any) -> None:
        watch = self.watch
        watch.end()
        try:
            if watch.pre:
                entry = self.evals.add(evalloss.forward_loss(output), watch.weight)
                self.pre.hold(self.step.cur, watch.key, watch.t0, self.clock(), entry)
                return
            self.on_between("eval")
            d = self.step.cur
            if not between.trained(d):  # between steps: its loss is the evaluation's
                between.attach(d, self.evals.add(evalloss.forward_loss(output),
                                                 watch.weight))
        except Exception as exc:
            self.failures.failed("evaluation hook", exc)

    def loss_end(self, output: Any) -> None:
        """A loss module ran on the last evaluation forward's output: that forward's loss."""
        try:
            self.evals.set_last(output)
        except Exception as exc:
            self.failures.failed("evaluation loss hook", exc)

    def on_between(self, kind: str) -> None:
        """An evaluation forward or a checkpoint save ended: book it between steps."""
        if self.manual and self.step.cur.micro and self.step.open:
            self.manual_boundary()  # a manual update loop's step ended with its update
        between.book(self.step.cur, kind, self.clock())

    def _on_module_zero_grad(self) -> None:
        if self.optimizer_seen() or not self.step.cur.micro:
            return
        if not self.manual:
            self.manual = True
            self.fp.note("step_boundary", "Module.zero_grad() after backward: no torch.optim "
                                          "optimizer stepped (manual update)")
            self.fp.describe_once("optimizer", "manual update (no torch.optim)")
        self.manual_boundary()

    def manual_boundary(self) -> None:
        """Close a step of a manual update loop (its grad norm: clip_grad_norm_'s, if any)."""
        d = self.step.cur
        if d.grad_norm is None and self.clip.value is not None:
            d.grad_norm = self.clip.value
        self.boundary()

    def wrap_closure(self, fn: Any) -> Any:
        """The primary optimizer's closure, timed (see :mod:`.closure`)."""
        step, clip, cl = self.step, self.clip, self.closure

        def on_end(index: int, seconds: float) -> None:
            try:
                cl.evaluated(seconds)
                if index == 0:
                    step.cur.grad_norm = clip.value if clip.value is not None else \
                        grad_norm_tensor(self.torch, cl.groups or [])
                    cl.first_done()
            except Exception as exc:
                self.failures.failed("closure hook", exc)

        return closure.wrap(fn, self.clock, on_end)
