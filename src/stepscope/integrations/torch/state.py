"""Per-process state of the zero-code instrumentation: the parts, and the step they make.

The hooks in :mod:`.hooks` only call the ``on_*`` methods here. The state is made of
small parts, each changed only through its own methods (or, for plain records, by the
module named beside it):

==================  ============================  ==========================================
part                class (module)                what it holds
==================  ============================  ==========================================
``step``            :class:`.pending.OpenStep`    the open step's record, open, index
``pending``         :class:`.pending.PendingSteps` finished steps until their device values
``phase``           :class:`.phases.PhaseClock`   forward depth, backward, device marks
``batches``         :class:`.batches.BatchCounter` tokens and samples, DataLoader seen
``accum``           :class:`.accum.Accumulation`  divisor, confirmed k, GradScaler copies
``closure``         :class:`.closure.ClosureStep` the primary optimizer's closure
``clip``            :class:`.clipnorm.ClipNorm`   the pre-clip norm of the step
``evals``           :class:`.evalloss.EvalLosses` evaluation losses and events
``lossless``        :class:`.between.LosslessRun` recurring lossless forwards between steps
``pre``             :class:`.firststep.PreTraining` forwards before the first training one
``loops``           :class:`.loops.Loops`         evaluation detection, manual updates
``frameworks``      :class:`.frameworks.FrameworkPatches` Trainer / Lightning / ZeRO patches
``fp``              :class:`.fingerprint.Fingerprint` baseline, config notes, device
``profile``         :class:`.profiling.ProfileWindow` the profiler capture
``comm``            :class:`.ddp.CommTimer`       communication intervals of the step
``failures``        :class:`.failures.Failures`   hook failures
==================  ============================  ==========================================

A step's numbers are accumulated in the open step's :class:`~.pending.StepData`; at the
step boundary (the primary optimizer's post-hook) the whole step is handed, as measured,
to the core's :class:`~stepscope.record.session.StepSession` (:mod:`.pending`).

What the process does besides timing (run.json, cross-rank, profiler, SIGTERM) lives in
:mod:`.fingerprint` and :mod:`.hooks`; :func:`.hooks.install` plugs it in through the
``on_*`` attributes of :class:`AutoState` (so this module imports neither at run time).
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from ...record.rank import resolve_rank
from ...record.recorder import Recorder
from ...record.session import StepSession
from . import between, ddp, evalloss, flopcount, layout
from .accum import Accumulation
from .batches import BatchCounter
from .clipnorm import ClipNorm
from .closure import ClosureStep
from .failures import Failures
from .fingerprint import Fingerprint
from .firststep import PreTraining
from .frameworks import FrameworkPatches
from .loops import Loops
from .pending import OpenStep, PendingSteps
from .phases import PhaseClock
from .profiling import ProfileWindow
from .readers import call_kwargs, dist_rank, grad_norm_tensor, scalar, scale_of
from .settings import Settings


def _nothing(*args: Any) -> None:
    return None


class AutoState:
    """The instrumented process: recorder (created lazily), its parts, the open step."""

    def __init__(self, settings: Settings, torch: Any,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.settings = settings
        self.torch = torch
        self.clock = clock
        self.rec: Recorder | None = None
        self.session: StepSession | None = None
        # Plugged in by hooks.install (see the module docstring).
        self.on_recorder: Callable[[AutoState], None] = _nothing
        self.on_model: Callable[[AutoState, Any], None] = _nothing
        self.on_optimizer: Callable[[AutoState, Any], None] = _nothing
        self.before_optimizer_step: Callable[[AutoState], None] = _nothing
        self.after_boundary: Callable[[AutoState], None] = _nothing
        self.before_close: Callable[[AutoState], None] = _nothing
        self.at_close: Callable[[AutoState, str, str | None], None] = _nothing
        self.failures = Failures()
        self.step = OpenStep()
        self.pending = PendingSteps()
        self.profile = ProfileWindow(torch, settings.profile_steps, settings.profile_dir,
                                     self.failures)
        self.phase = PhaseClock(torch, self.profile)
        self.batches = BatchCounter(torch)
        self.accum = Accumulation()
        self.closure = ClosureStep()
        self.clip = ClipNorm()
        self.evals = evalloss.EvalLosses()
        self.lossless = between.LosslessRun()
        self.pre = PreTraining()
        self.fp = Fingerprint()
        self.comm = ddp.CommTimer(clock=clock, wall=time.time)
        self.comm.phase = self.phase.now
        self.frameworks = FrameworkPatches(self.failures, self.pre, self.clip,
                                           self.eval_reported)
        self.loops = Loops(torch, clock, self.failures, self.step, self.phase, self.closure,
                           self.clip, self.evals, self.pre, self.fp, self.frameworks,
                           self.boundary, lambda: self.primary is not None)
        self.primary: Any = None  # weakref to the optimizer whose steps are boundaries
        self.param_cache: dict[int, bool] = {}  # module id -> it has parameters
        self.t_fwd0 = 0.0  # the outermost forward's start
        self.rank = resolve_rank()  # the environment's until the recorder is made
        self.pid = os.getpid()
        self.closed = False
        self.lock = threading.Lock()

    # -- step bookkeeping ----------------------------------------------------------------
    def activity(self) -> None:
        """Something of a training step happened: make sure a step (and recorder) is open."""
        if self.step.open:
            return
        if self.rec is None:
            self._create_recorder()
        self.step.begin(self.clock())

    def _create_recorder(self) -> None:
        env: dict[str, Any] = {}
        meta: dict[str, Any] = {"environment": env, "config": {"instrumentation": "auto"}}
        if self.settings.name:
            meta["name"] = self.settings.name
        # By the first step the process group exists: its rank beats the environment's
        # (mp.spawn workers have no RANK variable and would all be rank 0).
        self.rank = resolve_rank(lambda: dist_rank(self.torch))
        self.rec = Recorder(self.settings.run_dir, meta=meta, rank=self.rank, clock=self.clock)
        self.session = StepSession(self.rec, clock=self.clock)
        self.session.gather_after_step = False  # gathered inside a step (fingerprint)
        self.on_recorder(self)

    def on_batch(self, batch: Any, seconds: float) -> None:
        d = self.step.cur
        if not self.step.open and math.isnan(d.t_start):
            d.t_start = self.clock() - seconds  # the first step starts with its first fetch
        self.activity()
        self.batches.loader_batch(d, batch, seconds, self.fp.baseline)

    def on_forward_root(self, module: Any, args: Any) -> None:
        """The outermost module call of a forward pass starts (autograd enabled)."""
        self.activity()
        self.t_fwd0 = self.clock()
        self.phase.begin("forward")
        key = id(module)
        has_params = self.param_cache.get(key)
        if has_params is None:
            has_params = any(True for _ in module.parameters())
            self.param_cache[key] = has_params
            if has_params:
                self._first_sight(module, args)
        if not has_params:
            return
        d = self.step.cur
        if self.pre.segments:  # the trained model is known: were they evaluation?
            note = self.pre.resolve(d, self.evals, between.first_param_id(module))
            if note is not None:
                self.fp.note("before_training", note)
        if not d.fwd_calls:  # the step's first: evaluation or its own work?
            note = between.settle(d, self.evals, self.lossless, self.step.index)
            if note is not None:
                self.fp.note_once("between_steps", note)
        self._flush_evals()  # training resumed: the evaluation before it is complete
        d.fwd_calls += 1
        if self.closure.done:
            return  # a closure's re-evaluation (LBFGS): the batch is counted once
        self.batches.model_inputs(d, args, self.fp.baseline)
        if not self.batches.counted:
            # Global pre-hooks see positional arguments only; models called with
            # keywords (Hugging Face: model(**batch)) are read from the caller's
            # frame: no hook on the user's module (torch.save(model) must work).
            self.batches.model_inputs(d, call_kwargs(), self.fp.baseline)

    def _first_sight(self, module: Any, args: Any) -> None:
        """A module with parameters runs its first training forward."""
        self.on_model(self, module)
        self._note_layout(module)
        if self.fp.flop_call is None:  # shapes only: the count runs after step 1
            self.fp.flop_call = flopcount.capture_call(module, args, call_kwargs())
        self.frameworks.patch_loaded()

    def _note_layout(self, module: Any) -> None:
        """Once per model: it is trained (its evaluation is recognised), its layout."""
        key = between.first_param_id(module)
        if key is not None:
            self.loops.watch.trained(key)
        baseline = self.fp.baseline
        if "batch_layout" not in baseline:
            seq_first = layout.sequence_first(module)
            self.batches.sequence_first(seq_first)
            baseline["batch_layout"] = (
                f"[seq, batch] ({seq_first})" if seq_first else "[batch, seq]")
            baseline["embedding_lookup_params"] = layout.lookup_only_params(module)
            shape = layout.transformer_shape(getattr(module, "module", module))
            if shape:
                baseline["model_shape"] = shape

    def on_forward_root_end(self) -> None:
        d = self.step.cur
        d.forward += self.clock() - self.t_fwd0
        self.phase.end("forward", d.dev)

    def before_backward(self, tensor: Any) -> None:
        """Read the loss's accumulation divisor while its graph is alive (:mod:`.accum`)."""
        self.accum.before_backward(tensor, replay=self.closure.done)
        self._flush_evals()

    def on_backward(self, tensor: Any, seconds: float) -> None:
        d = self.step.cur
        d.backward += seconds
        self.phase.end("backward", d.dev)
        if self.closure.done:
            return  # a closure's re-evaluation: its time counts, its loss does not
        d.micro += 1
        try:
            if tensor is not None and tensor.numel() == 1:
                loss = self.accum.loss_of(tensor)
                d.divisors.append(self.accum.divisor)
                d.losses.append(loss.detach())
        except Exception as exc:
            self.failures.failed("loss capture", exc)
        if self.comm.compute_end is not None:
            d.compute_end = self.comm.compute_end
            self.comm.compute_end = None

    def on_optimizer_pre(self, opt: Any, has_closure: bool = False) -> bool:
        """Returns True when ``opt`` is the primary optimizer (its steps are boundaries).

        With a closure, the gradients are not this step's yet: the norm is taken after
        the closure's first evaluation (:meth:`.loops.Loops.wrap_closure`).
        """
        if self.primary is None:
            self.primary = weakref.ref(opt)
            self.on_optimizer(self, opt)
        if self.primary() is not opt:
            return False
        self.activity()
        d = self.step.cur
        groups = opt.param_groups
        if groups:
            d.lr = scalar(groups[0].get("lr"))
        if has_closure:
            self.closure.start(groups)
        elif self.clip.value is not None:
            d.grad_norm = self.clip.value
        elif self.settings.grad_norm_every and \
                self.step.index % self.settings.grad_norm_every == 0:
            d.grad_norm = grad_norm_tensor(self.torch, groups)
        self.before_optimizer_step(self)
        self.phase.begin("optimizer")
        return True

    def on_optimizer_post(self, seconds: float) -> None:
        # the closure's forward and backward are their own phases, not the optimizer's
        d = self.step.cur
        d.optimizer += max(0.0, seconds - self.closure.seconds)
        self.phase.end("optimizer", d.dev)
        self.boundary()

    def boundary(self, overflow: bool = False) -> None:
        """Close the current step: measure its end, queue it, open the next one."""
        d = self.step.cur
        t_end = self.clock()
        if math.isnan(d.t_start):
            d.t_start = t_end
        d.t_end = t_end
        d.wall_end = time.time()
        d.overflow = 1.0 if overflow else 0.0
        if self.accum.scaler is not None:
            d.loss_scale = scale_of(self.accum.scaler)
        if self.fp.mem_probe is not None:
            d.mem = self.fp.mem_probe()
        d.comm = self.comm.take()
        if d.compute_end is None:
            d.compute_end = self.comm.compute_end
        self.comm.compute_end = None
        if self.phase.cuda:
            d.done_event = self.phase.event()
        if self.step.index == 0:
            self.fp.first_micro = d.micro
        convention = self.accum.confirm(d.divisors)
        if convention is not None:
            self.fp.note("loss_convention", convention)
        d.accum_k = self.accum.k
        self.pending.push(d)
        self.step.finish(t_end)
        self.closure.reset()
        self.clip.clear()
        self.accum.end_step()
        self.flush(block=False)
        self.after_boundary(self)
        # Emission, profiler steps and the like ran inside the next step: say so (tool_s).
        cur = self.step.cur
        cur.tool += max(0.0, self.clock() - cur.t_start)

    # -- emission ------------------------------------------------------------------------
    def flush(self, block: bool) -> None:
        """Emit queued steps whose device values are ready (all of them when ``block``)."""
        self.pending.flush(block, self.session, self.settings, self.batches.saw_loader,
                           self.failures)

    def _flush_evals(self) -> None:
        evalloss.flush(self.evals, self.rec, self.step.index)

    def eval_reported(self, metrics: Mapping[str, float], source: str) -> None:
        """A framework reported an evaluation (:mod:`.frameworks`)."""
        evalloss.reported(self.evals, metrics, source, self.rec, self.step.index)

    # -- end of the process ----------------------------------------------------------------
    def close(self, status: str = "finished", error: str | None = None) -> None:
        if os.getpid() != self.pid:  # a forked child (DataLoader worker): not ours to close
            return
        with self.lock:
            if self.closed:
                return
            self.closed = True
        if self.loops.manual and self.step.cur.micro and self.step.open:
            self.loops.manual_boundary()  # a manual loop's last update: no zero_grad after
        self.before_close(self)  # e.g. stop a profiler still running
        self.flush(block=True)
        try:
            self._flush_evals()  # an evaluation after the last step
        except Exception as exc:
            self.failures.failed("evaluation record", exc)
        rec = self.rec
        if rec is None:
            return
        self.at_close(self, status, error)
        rec.close(status=status, error=error)
