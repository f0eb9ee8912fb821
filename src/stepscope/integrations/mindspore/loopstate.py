"""What ``stepscope run`` sees of a custom MindSpore loop, turned into one row per step.

The patches of :mod:`.auto` report calls here; this module decides where a step ends and
what it held. The boundary is the outermost of (first match wins per call):

* an ``@jit`` function whose code refers to an optimizer (a compiled train step),
* a ``TrainOneStepCell`` (or subclass) call,
* in GRAPH mode, a call of an ``nn.Cell`` holding an optimizer (a hand-written train cell),
* an ``nn.Optimizer`` call (the PyNative quick-start loop),
* in a loop with an amp loss scaler, the next step's first call after a step whose
  update was skipped (value_and_grad ran, no optimizer call, the scale fell): that step
  is recorded as ``skipped update`` with ``overflow`` 1.

Calls nested in a boundary call (the optimizer inside a PyNative TrainOneStepCell) add
their time, never a second boundary. ``value_and_grad`` results give the loss and the
gradients (PyNative: inside ``@jit`` the Python wrapper is not run); a boundary call's own
outputs give the loss otherwise (a train step returning the loss). Dataset iterators'
``__next__`` gives the data wait. A step runs from the previous boundary's end (the first
step: from its first observed call) to its boundary's end.

Example (what the patches do)::

    st = LoopState(settings, make_session)
    st.data_wait(batch, 0.002)
    st.forward_backward((loss, grads), args, 0.010)
    st.boundary("optimizer", 0.004, outputs=None, optimizer=opt)
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from typing import Any

from ...record.losscheck import ambiguous_loss, find_loss
from ...record.session import StepSession
from ..torch.settings import Settings
from .loss_scale import ScaleWatch
from .probes import batch_counts, grad_norm, loss_scale, optimizer_lr, to_float

__all__ = ["LoopState", "LOOKED_FOR"]

_NAN = math.nan
# What the boundary search looks for, named in `stepscope run`'s message when none is found.
LOOKED_FOR = ("Model.train, an nn.Optimizer call, a TrainOneStepCell call, a GRAPH-mode "
              "call of an nn.Cell holding an optimizer, an @jit function that refers to an "
              "optimizer, or a value_and_grad step whose update an amp loss scaler skipped")


class LoopState:
    """The open custom-loop step of this process (see the module docstring)."""

    def __init__(self, settings: Settings,
                 make_session: Callable[[LoopState, Any], StepSession],
                 clock: Callable[[], float] = time.perf_counter,
                 sync: Callable[[], None] | None = None) -> None:
        self.settings, self.make_session, self.clock = settings, make_session, clock
        self.sync = sync
        self.session: StepSession | None = None
        self.depth = 0
        self.in_model_train = 0
        self.kinds: set[str] = set()  # how boundaries were found ("jit step", ...)
        self.compiled = False  # a boundary or forward_backward call ran through @jit
        self.closed = False
        self.failures = 0
        self.steps = 0
        self.prev_end = _NAN
        self.scalers: list[Any] = []  # mindspore.amp loss scalers the script made
        # (value_and_grad's function, its first arguments): FLOPs counted after step 0
        self.flop_call: tuple[Any, tuple[Any, ...]] | None = None
        self.flops_done = False
        self.last_optimizer: Any = None
        self.scale = ScaleWatch()
        self._scale_open = False
        self._reset()

    def _reset(self) -> None:
        self.t_first = _NAN
        self.wait = self.fb = self.opt_s = 0.0
        self.loss: float | None = None
        self.what = ""
        self.grads: Any = None
        self.batch: Any = None

    # -- robustness ------------------------------------------------------------------------
    def failed(self, where: str, exc: BaseException) -> None:
        """Count a failure inside a patch; warn once. Training carries on unmeasured."""
        self.failures += 1
        if self.failures == 1:
            warnings.warn(f"stepscope: {where} failed ({type(exc).__name__}: {exc}); "
                          "training continues, this measurement may be incomplete",
                          RuntimeWarning, stacklevel=3)

    @property
    def listening(self) -> bool:
        """False inside Model.train (its callback records) and after the close."""
        return not self.closed and self.in_model_train == 0

    def sync_step(self) -> bool:
        """The open step is synchronised at its phase boundaries (every N-th step)."""
        n = self.settings.sync_every
        return self.sync is not None and n > 0 and self.steps % n == 0

    def _activity(self, t0: float) -> None:
        if math.isnan(self.t_first):
            self.t_first = t0
            if self.scalers and not self._scale_open:  # the scale this step runs with
                self.scale.begin(None, self.scalers[-1])
                self._scale_open = True

    def close_skipped(self, at: float) -> None:
        """The open step ran forward and backward, then skipped ``optimizer(grads)``
        because its loss scale fell (an amp loop's overflow): it ended at ``at``, the
        start of the next step's first call. Any other open step stays open."""
        if self.fb <= 0 or not self._scale_open or self.depth or self.closed:
            return
        before = self.scale.before
        if not loss_scale(self.scale.source) < before:
            return
        self.boundary("skipped update", 0.0, end=at, optimizer=self.last_optimizer)

    # -- what the patches report -----------------------------------------------------------
    def data_wait(self, batch: Any, seconds: float) -> None:
        if self.fb > 0 and self._scale_open:
            self.close_skipped(self.clock() - seconds)
        self._activity(self.clock() - seconds)
        self.wait += seconds
        if self.batch is None:
            self.batch = batch

    def forward_backward(self, result: Any, args: tuple[Any, ...], seconds: float,
                         compiled: bool = False) -> None:
        """A ``value_and_grad`` function (or a compiled one calling it) returned."""
        if self.fb > 0 and self._scale_open:
            self.close_skipped(self.clock() - seconds)
        self._activity(self.clock() - seconds)
        self.fb += seconds
        self.compiled = self.compiled or compiled
        if self.batch is None and args:
            self.batch = args
        if isinstance(result, tuple) and len(result) == 2:
            value, grads = result
            self.grads = grads
            if isinstance(value, tuple) and value:  # has_aux=True: (loss, aux...)
                value = value[0]
            self.loss, self.what = find_loss(value, to_float)
            scale = self.scale.before if self._scale_open else _NAN
            if self.loss is not None and scale == scale and scale > 0:
                # an amp loss scaler: the differentiated function returns the loss times
                # the scale (amp tutorial: loss_scaler.scale(loss)); record the loss
                self.loss /= scale

    def enter(self) -> bool:
        """A boundary candidate starts; True when it is the outermost (its loss scale,
        when the script made an amp loss scaler, is the one the step runs with)."""
        self.depth += 1
        if self.depth == 1 and self.scalers and not self._scale_open:
            self.scale.begin(None, self.scalers[-1])
            self._scale_open = True
        return self.depth == 1

    def leave(self) -> None:
        self.depth = max(0, self.depth - 1)

    def boundary(self, kind: str, seconds: float, *, outputs: Any = None,
                 args: tuple[Any, ...] = (), optimizer: Any = None, network: Any = None,
                 lr: float = _NAN, compiled: bool = False, end: float = _NAN) -> None:
        """The outermost boundary call ended now (or at ``end``): record the step it
        closes."""
        end = self.clock() if math.isnan(end) else end
        self._activity(end - seconds)
        if optimizer is not None:
            self.last_optimizer = optimizer  # (a skipped update's LR is its optimizer's)
        if kind not in self.kinds:
            self.kinds.add(kind)
            if self.session is not None and self.session.rank == 0:  # a new kind, once
                self.session.rec.run.update_meta(
                    config={"step_boundary": " + ".join(sorted(self.kinds))})
        self.compiled = self.compiled or compiled
        if kind == "optimizer":
            self.opt_s += seconds
        if self.batch is None and args:
            self.batch = args
        from_outputs = self.loss is None and outputs is not None
        if from_outputs:
            self.loss, self.what = find_loss(outputs, to_float)
        if self.session is None:
            self.session = self.make_session(self, network if network is not None
                                             else optimizer)
            warning = ambiguous_loss(outputs) if from_outputs else None
            if warning is not None:
                self.session.rec.run.append_event({"type": "warning", "message": warning,
                                                   "rank": self.session.rank})
        start = self.t_first if math.isnan(self.prev_end) else self.prev_end
        self._emit(start, end, lr, optimizer)
        if not self.flops_done:
            self._count_flops()
        if self.sync_step() and self.sync is not None:
            self.sync()  # the next step is synced: it starts with an empty queue
        # (stepscope's own time is billed by the session)
        self.prev_end = self.clock() if kind != "skipped update" else end

    def _count_flops(self) -> None:
        """Once, after the first step: the FLOPs of value_and_grad's function on its first
        arguments (see :mod:`.autoflops`); without one, the run says why it has no MFU."""
        self.flops_done = True
        core = self.session
        if core is None or core.rank != 0:
            return
        from . import autoflops

        if self.flop_call is None:
            autoflops.note(core, "no value_and_grad function ran outside @jit (the step's "
                                 "forward was compiled, so its cells' shapes were not seen)")
            return
        fn, args = self.flop_call
        self.flop_call = None
        autoflops.attach_function(core, fn, args)

    def _emit(self, start: float, end: float, lr: float, optimizer: Any) -> None:
        assert self.session is not None
        tokens, samples = (batch_counts(self.batch, None) if self.batch is not None
                           else (_NAN, _NAN))
        if self.settings.tokens_per_step == self.settings.tokens_per_step:
            tokens = self.settings.tokens_per_step
        if self.settings.samples_per_step == self.settings.samples_per_step:
            samples = self.settings.samples_per_step
        values = {"lr": lr if lr == lr else optimizer_lr(optimizer)}
        overflow = None
        if self.grads is not None:
            try:
                values["grad_norm"] = grad_norm(self.grads)
                overflow = not math.isfinite(values["grad_norm"])
            except Exception as exc:
                self.failed("gradient norm", exc)
        if self._scale_open:  # the scale fell during the step: it overflowed
            values.update(self.scale.end(overflow))
            self._scale_open = False
        elif overflow is not None and self.scalers:
            values["overflow"] = float(overflow)
        phases = {"data_wait": self.wait}
        if self.fb:
            phases["forward_backward"] = self.fb
        if self.opt_s:
            phases["optimizer"] = self.opt_s
        synced = self.sync_step() and (self.fb > 0 or self.opt_s > 0)
        self.session.record(start, end, tokens=tokens, samples=samples, phases=phases,
                            values=values, loss=self.loss,
                            missing_loss=(f"were {self.what}, which hold no scalar loss"
                                          if self.what else "held no loss (no value_and_grad "
                                          "result or scalar step output was seen)"),
                            synced=synced)
        self.steps += 1
        self._reset()
        if self.settings.max_steps and self.steps >= self.settings.max_steps:
            raise SystemExit(0)
