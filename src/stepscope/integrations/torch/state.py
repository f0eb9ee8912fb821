"""Per-process state of the zero-code instrumentation: the open step and its emission.

The hooks in :mod:`.hooks` only call the ``on_*`` methods here. A step's numbers are
accumulated in a :class:`~.values.StepData`; at the step boundary (the primary optimizer's
post-hook) the whole step is handed, as measured, to the core's
:class:`~stepscope.record.session.StepSession`. A half-finished step (e.g. evaluation after the
last optimizer step, or a crash) is therefore never written.

What the process does besides timing (run.json, cross-rank, profiler, SIGTERM) lives in
:mod:`.meta` and :mod:`.hooks`; :func:`.hooks.install` plugs it in through the ``on_*``
attributes of :class:`AutoState` (so this module imports neither).

On CUDA, rows are emitted one step late: loss, gradient norm, loss scale and the CUDA
events of the communication timer are read once the device has finished them, so that no
host synchronisation is added to any step.
"""

from __future__ import annotations

import math
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from ...record.rank import resolve_rank
from ...record.recorder import Recorder
from ...record.session import StepSession
from . import accum, between, ddp, evalloss, firststep, flopcount, frameworks, layout, loops
from .marks import PhaseMarks
from .pending import StepData, emit
from .probes import MemProbe, batch_counts
from .readers import call_kwargs, dist_rank, grad_norm_tensor, scalar, scale_of, shape_of
from .settings import Settings

_NAN = math.nan


def _nothing(*args: Any) -> None:
    return None


class AutoState:
    """The instrumented process: recorder (created lazily), open step, fingerprint."""

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
        self.cur = StepData()
        self.open = False
        self.step_index = 0
        self.pending: list[StepData] = []
        self.depth = 0
        self.stack: list[int] = []  # per module call in progress (see hooks)
        self.t_fwd0 = 0.0
        self.dev_open: dict[str, Any] = {}
        self.root: Any = None  # the outermost module of the forward in progress
        self.root_counted = False
        self.in_backward = False
        self.quiet = False  # stepscope runs the model itself (FLOPs count): hooks stand by
        self.primary: Any = None  # weakref to the optimizer whose steps are boundaries
        self.t_opt0 = 0.0
        self.clip_norm: Any = None
        self.scaled: dict[int, Any] = {}
        self.scaler: Any = None
        self.param_cache: dict[int, bool] = {}
        self.flop_call: Any = None  # (model, meta args, meta kwargs) of the first forward
        self.device: Any = None
        self.cuda = False
        self.mem_probe: MemProbe | None = None
        self.baseline: dict[str, Any] = {}
        self.config: dict[str, Any] = {}
        self.notes: dict[str, str] = {}
        self.failures = 0
        self.closed = False
        self.lock = threading.Lock()
        self.comm = ddp.CommTimer(clock=clock, wall=time.time)
        self.comm.phase = self._phase_now
        self.profiler: Any = None
        self.marks = PhaseMarks(torch)
        self.rank = resolve_rank()  # the environment's until the recorder is made
        self.first_micro = 0
        self.pid = os.getpid()
        self.saw_loader = False
        self.last_comm: ddp.CommStep | None = None
        # third-party loops (issue 13): what the trained models are, evaluation between
        # steps, closure optimizers, accumulation scaling, [seq, batch] inputs
        self.train_params: set[int] = set()  # first-parameter ids of trained models
        self.eval_open = False  # an evaluation forward (outermost) is running
        self.closure_s = 0.0  # time inside the primary optimizer's closure this step
        self.closure_done = False  # the closure's first evaluation of this step is over
        self.closure_groups: Any = None
        self.accum_k: float | None = None
        self.divisor: float | None = None  # of the loss backward() is running on
        self.seq_first: str | None = None
        self.ddp_hooked: weakref.WeakSet[Any] = weakref.WeakSet()
        self.manual_steps = False  # boundaries at Module.zero_grad (no torch.optim seen)
        # evaluation losses between steps (.evalloss) and the frameworks' own (.frameworks)
        self.evals = evalloss.EvalLosses()
        self.eval_weight = 1.0
        self.eval_events: list[dict[str, Any]] = []
        self.frameworks_patched: set[str] = set()
        # no-grad forwards before the first training forward (.firststep)
        self.pre_segments: list[firststep.Segment] = []
        self.probes: tuple[int, float] = (0, 0.0)
        self.eval_pre = False
        self.eval_key: int | None = None
        self.eval_t0 = 0.0
        self.lossless_run = 0  # steps in a row with lossless forwards before them (.between)

    def _phase_now(self) -> str:
        if self.in_backward:
            return "backward"
        return "forward" if self.depth > 0 else "other"

    # -- robustness --------------------------------------------------------------------
    def failed(self, where: str, exc: BaseException) -> None:
        """Count a failure inside a hook; warn once. Training carries on unmeasured."""
        self.failures += 1
        if self.failures == 1:
            warnings.warn(f"stepscope: {where} failed ({type(exc).__name__}: {exc}); "
                          "training continues, this measurement may be incomplete",
                          RuntimeWarning, stacklevel=3)

    # -- step bookkeeping ----------------------------------------------------------------
    def activity(self) -> None:
        """Something of a training step happened: make sure a step (and recorder) is open."""
        if self.open:
            return
        if self.rec is None:
            self._create_recorder()
        if math.isnan(self.cur.t_start):
            self.cur.t_start = self.clock()
        self.open = True

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
        self.session.gather_after_step = False  # gathered inside a step (meta)
        self.on_recorder(self)

    def on_batch(self, batch: Any, seconds: float) -> None:
        d = self.cur
        if not self.open and math.isnan(d.t_start):
            d.t_start = self.clock() - seconds  # the first step starts with its first fetch
        self.activity()
        d.data_wait += seconds
        d.loader_batches += 1
        tokens, samples = batch_counts(batch)
        if not math.isnan(tokens):
            d.loader_tokens += tokens
        if not math.isnan(samples):
            d.loader_samples += samples
        if "batch_shape" not in self.baseline:
            self._note_batch(batch, tokens, samples)

    def _note_batch(self, batch: Any, tokens: float, samples: float) -> None:
        self.baseline["batch_shape"] = shape_of(batch, self.torch)
        if not math.isnan(samples):
            self.baseline.setdefault("micro_batch", int(samples))
        if not math.isnan(tokens) and samples:
            self.baseline.setdefault("seq_len", int(tokens // samples))

    def on_forward_root(self, module: Any, args: Any) -> None:
        """The outermost module call of a forward pass starts (autograd enabled)."""
        self.activity()
        self.t_fwd0 = self.clock()
        self.dev_begin("forward")
        key = id(module)
        has_params = self.param_cache.get(key)
        if has_params is None:
            has_params = any(True for _ in module.parameters())
            self.param_cache[key] = has_params
            if has_params:
                self.on_model(self, module)
                self._note_layout(module)
                if self.flop_call is None:  # shapes only: the count runs after step 1
                    self.flop_call = flopcount.capture_call(module, args, call_kwargs())
                frameworks.patch_loaded(self)
        self.root = module if has_params else None
        if has_params:
            if self.pre_segments:  # the trained model is known: were they evaluation?
                firststep.resolve(self, between.first_param_id(module))
            if not self.cur.fwd_calls:  # the step's first: evaluation or its own work?
                between.settle(self)
            evalloss.flush(self)  # training resumed: the evaluation before it is complete
            self.cur.fwd_calls += 1
            if self.closure_done:
                return  # a closure's re-evaluation (LBFGS): the batch is counted once
            self._count_inputs(args)
            if not self.root_counted:
                # Global pre-hooks see positional arguments only; models called with
                # keywords (Hugging Face: model(**batch)) are read from the caller's
                # frame: no hook on the user's module (torch.save(model) must work).
                self._count_inputs(call_kwargs())

    def _note_layout(self, module: Any) -> None:
        """Once per model: it is trained (its evaluation is recognised), its layout."""
        key = between.first_param_id(module)
        if key is not None:
            self.train_params.add(key)
        if "batch_layout" not in self.baseline:
            self.seq_first = layout.sequence_first(module)
            self.baseline["batch_layout"] = (
                f"[seq, batch] ({self.seq_first})" if self.seq_first else "[batch, seq]")
            self.baseline["embedding_lookup_params"] = layout.lookup_only_params(module)
            shape = layout.transformer_shape(getattr(module, "module", module))
            if shape:
                self.baseline["model_shape"] = shape

    def _count_inputs(self, inputs: Any) -> None:
        tokens, samples = batch_counts(inputs)
        self.root_counted = not math.isnan(tokens)
        if self.root_counted and self.seq_first and samples:
            samples = tokens / samples  # [seq, batch]: the leading dimension is seq
        if self.root_counted:  # token ids seen: count them and their samples
            d = self.cur
            d.fwd_tokens += tokens
            d.fwd_samples += samples
            d.fwd_counted += 1
            if "model_input_shape" not in self.baseline:
                self.baseline["model_input_shape"] = shape_of(inputs, self.torch)
                self.baseline["micro_batch"] = int(samples)
                self.baseline["seq_len"] = int(tokens // samples)

    def on_forward_root_end(self) -> None:
        self.cur.forward += self.clock() - self.t_fwd0
        self.dev_end("forward")

    # -- device-time marks (CUDA events; nothing on CPU) --------------------------------
    def dev_begin(self, phase: str) -> None:
        """Mark a phase start on the current CUDA stream (no host synchronisation), and
        in the profiler capture while one runs (``marks``)."""
        self.marks.begin(phase, active=self.profiler is not None)
        if self.cuda:
            self.dev_open[phase] = self._event()

    def dev_end(self, phase: str) -> None:
        self.marks.end(phase)
        start = self.dev_open.pop(phase, None) if self.cuda else None
        if start is not None:
            self.cur.dev.append((phase, start, self._event()))

    def _event(self) -> Any:
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def before_backward(self, tensor: Any) -> None:
        """Read the loss's accumulation divisor while its graph is alive (:mod:`.accum`)."""
        self.divisor = None
        evalloss.flush(self)
        if tensor is not None and tensor.numel() == 1 and not self.closure_done:
            src = self.scaled.get(id(tensor))
            self.divisor = accum.divisor(src if src is not None else tensor)

    def on_backward(self, tensor: Any, seconds: float) -> None:
        d = self.cur
        d.backward += seconds
        self.dev_end("backward")
        if self.closure_done:
            return  # a closure's re-evaluation: its time counts, its loss does not
        d.micro += 1
        try:
            if tensor is not None and tensor.numel() == 1:
                src = self.scaled.get(id(tensor))
                loss = src if src is not None else tensor
                d.divisors.append(self.divisor)
                d.losses.append(loss.detach())
        except Exception as exc:
            self.failed("loss capture", exc)
        if self.comm.compute_end is not None:
            d.compute_end = self.comm.compute_end
            self.comm.compute_end = None

    def on_optimizer_pre(self, opt: Any, has_closure: bool = False) -> bool:
        """Returns True when ``opt`` is the primary optimizer (its steps are boundaries).

        With a closure, the gradients are not this step's yet: the norm is taken after
        the closure's first evaluation (:meth:`wrap_closure`).
        """
        if self.primary is None:
            self.primary = weakref.ref(opt)
            self.on_optimizer(self, opt)
        if self.primary() is not opt:
            return False
        self.activity()
        d = self.cur
        groups = opt.param_groups
        if groups:
            d.lr = scalar(groups[0].get("lr"))
        if has_closure:
            self.closure_groups = groups
        elif self.clip_norm is not None:
            d.grad_norm = self.clip_norm
        elif self.settings.grad_norm_every and \
                self.step_index % self.settings.grad_norm_every == 0:
            d.grad_norm = grad_norm_tensor(self.torch, groups)
        self.before_optimizer_step(self)
        self.dev_begin("optimizer")
        self.t_opt0 = self.clock()
        return True

    def on_optimizer_post(self, seconds: float) -> None:
        # the closure's forward and backward are their own phases, not the optimizer's
        self.cur.optimizer += max(0.0, seconds - self.closure_s)
        self.dev_end("optimizer")
        self.boundary()

    def boundary(self, overflow: bool = False) -> None:
        """Close the current step: measure its end, queue it, open the next one."""
        d = self.cur
        t_end = self.clock()
        if math.isnan(d.t_start):
            d.t_start = t_end
        d.t_end = t_end
        d.wall_end = time.time()
        d.overflow = 1.0 if overflow else 0.0
        if self.scaler is not None:
            d.loss_scale = scale_of(self.scaler)
        if self.mem_probe is not None:
            d.mem = self.mem_probe()
        d.comm = self.comm.take()
        if d.compute_end is None:
            d.compute_end = self.comm.compute_end
        self.comm.compute_end = None
        if self.cuda:
            d.done_event = self._event()
        if self.step_index == 0:
            self.first_micro = d.micro
        k = accum.confirms(d.divisors)
        if k is not None and self.accum_k is None:
            self.accum_k = k
            self.config["loss_convention"] = accum.CONVENTION.format(k=k)
        d.accum_k = self.accum_k
        self.pending.append(d)
        self.cur = StepData(t_start=t_end)
        self.closure_s, self.closure_done, self.closure_groups = 0.0, False, None
        self.clip_norm = None
        self.scaled.clear()
        self.open = False
        self.step_index += 1
        self.flush(block=False)
        self.after_boundary(self)
        # Emission, profiler steps and the like ran inside the next step: say so (tool_s).
        self.cur.tool += max(0.0, self.clock() - self.cur.t_start)

    # -- emission ------------------------------------------------------------------------
    def flush(self, block: bool) -> None:
        """Emit queued steps whose device values are ready (all of them when ``block``)."""
        while self.pending:
            d = self.pending[0]
            ev = d.done_event
            if ev is not None and not ev.query():
                if not block and len(self.pending) <= 2:
                    return  # the device is still on it: read it at a later boundary
                ev.synchronize()  # at most two steps behind, or the run is ending
            self.pending.pop(0)
            if self.session is None:
                continue
            try:
                self.last_comm = emit(self.session, self.settings, d, self.saw_loader)
            except Exception as exc:
                self.failed("step emission", exc)

    # -- end of the process ----------------------------------------------------------------
    def close(self, status: str = "finished", error: str | None = None) -> None:
        if os.getpid() != self.pid:  # a forked child (DataLoader worker): not ours to close
            return
        with self.lock:
            if self.closed:
                return
            self.closed = True
        if self.manual_steps and self.cur.micro and self.open:
            loops.manual_boundary(self)  # a manual loop's last update: no zero_grad after
        self.before_close(self)  # e.g. stop a profiler still running
        self.flush(block=True)
        try:
            evalloss.flush(self)  # an evaluation after the last step
        except Exception as exc:
            self.failed("evaluation record", exc)
        rec = self.rec
        if rec is None:
            return
        self.at_close(self, status, error)
        rec.close(status=status, error=error)

