"""Zero-code MindSpore instrumentation: what ``stepscope run`` installs after ``import mindspore``.

``stepscope run -- python train.py`` (or ``-- msrun ... train.py``) puts a ``sitecustomize``
on ``PYTHONPATH``; :mod:`stepscope.integrations.ms_boot` waits for the script to import
MindSpore and then calls :func:`install`, which patches, in this process only:

* ``Model.train``: a :class:`.callback.StepscopeCallback` is added to the callbacks (one per
  process, kept across ``Model.train`` calls; a script's own StepscopeCallback wins);
* custom loops (:mod:`.loopstate` says how a boundary is chosen): ``nn.Optimizer`` and
  ``nn.TrainOneStepCell`` calls, GRAPH-mode calls of a cell holding an optimizer
  (``nn.Cell.compile_and_run``), functions made by ``mindspore.jit`` (a compiled train
  step when the function refers to an optimizer), functions made by
  ``mindspore.value_and_grad`` (loss, gradients, ``forward_backward_s``; the function is
  run once more after the first step to count its FLOPs, :mod:`.autoflops`), and
  dataset iterators' ``__next__`` (``data_wait_s``);
* ``sys.excepthook``, SIGTERM and ``atexit``: the records close ``failed`` with the
  exception, or ``finished``. A process that imported MindSpore and recorded no step leaves
  an ``attach_failed`` event, and ``stepscope run`` exits non-zero naming what it looked for.

Phases of custom loops are synchronised (``mindspore.runtime.synchronize``) at their
boundaries every ``STEPSCOPE_SYNC_EVERY``-th step (default 10; 0 = never): MindSpore
dispatches asynchronously even on CPU, so unsynced phase times say where the host waited.

Every patch body is wrapped: a failure inside stepscope is warned about once, never raised
into training (``STEPSCOPE_MAX_STEPS`` is the one deliberate exit).

Example (what the boot hook does)::

    from stepscope.integrations.mindspore import auto
    auto.install(Settings.from_env())
"""

from __future__ import annotations

import atexit
import functools
import inspect
import os
import sys
import time
from typing import Any

import mindspore as ms
from mindspore import nn

from ...record.signals import install_sigterm_finaliser
from ...rundir.store import RunDir
from ..torch.settings import Settings
from .callback import StepscopeCallback, crash_event, make_session
from .loopstate import LOOKED_FOR, LoopState
from .probes import model_fingerprint, optimizer_lr, rank_and_world

__all__ = ["install", "state"]

_STATE: LoopState | None = None
_CALLBACK: list[StepscopeCallback] = []  # the callback injected into Model.train


def state() -> LoopState | None:
    """This process's custom-loop state once :func:`install` ran."""
    return _STATE


def install(settings: Settings) -> LoopState:
    """Patch MindSpore (see the module docstring); idempotent."""
    global _STATE
    if _STATE is not None:
        return _STATE
    sync = getattr(getattr(ms, "runtime", None), "synchronize", None)
    st = LoopState(settings, _loop_session, sync=sync)
    _STATE = st
    _patch_model_train(st)
    _patch_boundaries(st)
    _patch_graph_cells(st)
    _patch_value_and_grad(st)
    _patch_jit(st)
    _patch_dataset(st)
    _patch_amp(st)
    install_sigterm_finaliser(lambda: close(st, "failed", "terminated by SIGTERM"))
    prev = sys.excepthook

    def excepthook(et: Any, e: Any, tb: Any) -> None:
        close(st, "failed", f"{et.__name__}: {e}")
        prev(et, e, tb)

    sys.excepthook = excepthook
    atexit.register(close, st, "finished", None)
    return st


def _mode(st: LoopState) -> str:
    if ms.get_context("mode") == ms.GRAPH_MODE:
        return "graph"
    return "pynative+jit" if st.compiled else "pynative"


def _loop_session(st: LoopState, owner: Any) -> Any:
    net = owner if isinstance(owner, nn.Cell) and not isinstance(owner, nn.Optimizer) else None
    opt = owner if isinstance(owner, nn.Optimizer) else None
    baseline: dict[str, Any] = {"execution_mode": _mode(st)}
    if net is None and opt is not None:  # the optimizer's parameters are the model's
        baseline.update(model_fingerprint(None, params=opt.parameters))
    meta: dict[str, Any] = {"baseline": baseline, "config": {
        "stepscope_integration": "mindspore custom loop (stepscope run)",
        "step_boundary": " + ".join(sorted(st.kinds)),
        "sync_every": st.settings.sync_every if st.sync is not None else 0}}
    if st.settings.name:
        meta["name"] = st.settings.name
    return make_session(st.settings.run_dir, meta, net, opt, _profile(st.settings),
                        st.settings.cross_rank_every, "the custom loop", cells=(net, opt))


def _profile(settings: Settings) -> tuple[int, int] | None:
    p = settings.profile_steps  # half-open (a, b + 1)
    return (p[0], p[1] - 1) if p else None


def close(st: LoopState, status: str, error: str | None) -> None:
    """Close what recorded (loop session, injected callback); note a failed attachment."""
    if st.closed:
        return
    st.closed = True
    try:
        recorded = False
        st.close_skipped(st.clock())  # a last step whose update was skipped
        for cb in _CALLBACK:
            cb.flush()  # its pending steps (recorded in batches) first
        for core in [st.session] + [cb.core for cb in _CALLBACK]:
            if core is None:
                continue
            recorded = recorded or core.step > 0
            if status == "failed" and not core.rec._closed:
                core.rec.run.append_event(crash_event(core, error))
            core.close(status, error)
        if recorded or os.path.basename(sys.argv[0] if sys.argv else "") == "msrun":
            return
        run = RunDir(st.settings.run_dir)
        if status == "failed":  # it crashed before its first step: that is the story
            run.append_event({"type": "crash", "rank": rank_and_world()[0], "error": error,
                              "wall_time_s": time.time(), "step": 0})
        else:
            run.append_event({"type": "attach_failed", "framework": "mindspore",
                              "pid": os.getpid(), "looked_for": LOOKED_FOR,
                              "argv": list(sys.argv[:3])})
    except Exception as exc:  # measuring must never break training (or its exit)
        st.failed("closing the records", exc)


def _guard(st: LoopState, where: str, fn: Any, *args: Any, **kwargs: Any) -> None:
    try:
        fn(*args, **kwargs)
    except SystemExit:
        raise
    except Exception as exc:
        st.failed(where, exc)


def _patch_model_train(st: LoopState) -> None:
    from mindspore.train import Model

    orig = Model.train
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def train(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            args, kwargs = _with_callback(st, sig, self, args, kwargs)
        except Exception as exc:
            st.failed("Model.train hook", exc)
        st.in_model_train += 1
        try:
            return orig(self, *args, **kwargs)
        finally:
            st.in_model_train -= 1

    Model.train = train


def _with_callback(st: LoopState, sig: inspect.Signature, model: Any, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    bound = sig.bind(model, *args, **kwargs)
    cbs = bound.arguments.get("callbacks")
    given = [] if cbs is None else list(cbs) if isinstance(cbs, (list, tuple)) else [cbs]
    if st.closed or any(isinstance(c, StepscopeCallback) for c in given):
        return args, kwargs
    if not _CALLBACK:
        s = st.settings
        cb = StepscopeCallback(s.run_dir, profile_steps=_profile(s),
                               cross_rank_every=s.cross_rank_every, keep_open=True,
                               meta={"name": s.name} if s.name else None)
        cb.check_scale = False  # Model.__init__ was checked (_check_model)
        _CALLBACK.append(cb)
    bound.arguments["callbacks"] = given + [_CALLBACK[0]]
    return bound.args[1:], bound.kwargs


def _timed_boundary(st: LoopState, kind: str, orig: Any, parts: Any) -> Any:
    """A ``__call__`` that closes a step when it is the outermost boundary call."""
    clock = st.clock

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not st.listening or not st.enter():
            try:
                return orig(self, *args, **kwargs)
            finally:
                if st.listening:
                    st.leave()
        opt, net = parts(self)
        lr = optimizer_lr(opt) if kind == "optimizer" else float("nan")
        sync = st.sync if st.sync_step() else None
        if sync is not None and kind == "optimizer":
            sync()  # what ran before the update is not the update's
        try:
            t0 = clock()
            out = orig(self, *args, **kwargs)
            if sync is not None:
                sync()
            dt = clock() - t0
        finally:
            st.leave()
        _guard(st, f"{kind} hook", st.boundary, kind, dt, outputs=out, args=args,
               optimizer=opt, network=net, lr=lr,
               compiled=ms.get_context("mode") == ms.GRAPH_MODE)
        return out

    return call


def _patch_graph_cells(st: LoopState) -> None:
    """GRAPH mode: a top-level ``nn.Cell`` call that compiles and runs a cell holding an
    optimizer (a custom train step: value_and_grad + optimizer in its construct) is a
    step boundary. ``compile_and_run`` is only reached in GRAPH mode, once per call of the
    outermost cell (the cells inside are compiled into its graph), so PyNative loops pay
    nothing for this patch."""
    orig = nn.Cell.compile_and_run
    holds: dict[int, Any] = {}  # id(cell) -> its optimizer, or None (classified once)
    timed = _timed_boundary(st, "graph cell", orig, lambda c: (holds.get(id(c)), None))

    def compile_and_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        key = id(self)
        if key not in holds:
            holds[key] = next((c for _, c in self.cells_and_names()
                               if isinstance(c, nn.Optimizer)), None)
        if holds[key] is None or isinstance(self, nn.Optimizer):
            return orig(self, *args, **kwargs)
        return timed(self, *args, **kwargs)

    nn.Cell.compile_and_run = compile_and_run


def _patch_boundaries(st: LoopState) -> None:
    nn.Optimizer.__call__ = _timed_boundary(st, "optimizer", nn.Cell.__call__,
                                            lambda o: (o, None))
    nn.TrainOneStepCell.__call__ = _timed_boundary(
        st, "train cell", nn.TrainOneStepCell.__call__,
        lambda c: (getattr(c, "optimizer", None), getattr(c, "network", None)))


def _patch_value_and_grad(st: LoopState) -> None:
    orig = ms.value_and_grad
    clock = st.clock

    @functools.wraps(orig)
    def value_and_grad(*a: Any, **k: Any) -> Any:
        fn = orig(*a, **k)

        # Inside @jit the compiler reads through the wrapper (__wrapped__): this body runs
        # in PyNative only, where the call returns real tensors.
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not st.listening:
                return fn(*args, **kwargs)
            t0 = clock()
            out = fn(*args, **kwargs)
            if st.sync is not None and st.sync_step():
                st.sync()
            _guard(st, "value_and_grad hook", st.forward_backward, out, args, clock() - t0)
            if st.flop_call is None and a and not kwargs:  # counted after the first step
                st.flop_call = (a[0], args)
            return out

        timed._stepscope_vag = True  # type: ignore[attr-defined]
        return timed

    ms.value_and_grad = value_and_grad
    if getattr(ms.ops, "value_and_grad", None) is orig:
        ms.ops.value_and_grad = value_and_grad


def _patch_jit(st: LoopState) -> None:
    orig = ms.jit

    @functools.wraps(orig)
    def jit(function: Any = None, *args: Any, **kwargs: Any) -> Any:
        if function is None:
            inner = orig(None, *args, **kwargs)
            return lambda fn: _wrap_jitted(st, fn, inner(fn))
        return _wrap_jitted(st, function, orig(function, *args, **kwargs))

    ms.jit = jit


def _classify(fn: Any, depth: int = 0) -> tuple[str, Any, Any]:
    """("step", optimizer, network) when ``fn`` refers to an optimizer or train cell,
    ("fb", None, None) when to a value_and_grad function, else ("other", None, None)."""
    cv = inspect.getclosurevars(fn)
    values = [*cv.nonlocals.values(), *cv.globals.values()]
    for v in values:
        if isinstance(v, nn.TrainOneStepCell):
            return "step", getattr(v, "optimizer", None), getattr(v, "network", None)
        if isinstance(v, nn.Optimizer):
            return "step", v, None
    found = "fb" if any(getattr(v, "_stepscope_vag", False) for v in values) else "other"
    if depth < 1:  # one level of helper functions (train_step -> forward_fn / update)
        for v in values:
            if inspect.isfunction(v) and v is not fn:
                kind = _classify(inspect.unwrap(v), depth + 1)
                if kind[0] == "step":
                    return kind
                if kind[0] == "fb":
                    found = "fb"
    return found, None, None


def _wrap_jitted(st: LoopState, fn: Any, jitted: Any) -> Any:
    if not inspect.isfunction(fn) or not callable(jitted):
        return jitted
    clock = st.clock
    kind: list[tuple[str, Any, Any]] = []

    @functools.wraps(jitted)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not st.listening:
            return jitted(*args, **kwargs)
        if not kind:
            try:
                kind.append(_classify(fn))
            except Exception:  # e.g. no source: an ordinary compiled function
                kind.append(("other", None, None))
        what, opt, net = kind[0]
        if what == "other" or (what == "step" and not st.enter()):
            try:
                return jitted(*args, **kwargs)
            finally:
                if what == "step":
                    st.leave()
        lr = optimizer_lr(opt) if what == "step" else float("nan")
        try:
            t0 = clock()
            out = jitted(*args, **kwargs)
            if st.sync is not None and st.sync_step():
                st.sync()
            dt = clock() - t0
        finally:
            if what == "step":
                st.leave()
        if what == "fb":
            _guard(st, "jit hook", st.forward_backward, out, args, dt, compiled=True)
        else:
            _guard(st, "jit hook", st.boundary, "jit step", dt, outputs=out, args=args,
                   optimizer=opt, network=net, lr=lr, compiled=True)
        return out

    return call


def _patch_amp(st: LoopState) -> None:
    """Loss scalers (``mindspore.amp``) and managers given to ``Model`` are noted: the
    scale a step runs with, overflow from its backoff, set-ups that cannot work."""
    from mindspore import amp
    from mindspore.train import Model

    for cls in (amp.DynamicLossScaler, amp.StaticLossScaler):
        orig_init = cls.__init__

        def init(self: Any, *args: Any, __orig: Any = orig_init, **kwargs: Any) -> None:
            __orig(self, *args, **kwargs)
            st.scalers.append(self)

        cls.__init__ = init
    orig = Model.__init__
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def model_init(self: Any, *args: Any, **kwargs: Any) -> None:
        _guard(st, "Model hook", _check_model, st, sig.bind(self, *args, **kwargs))
        orig(self, *args, **kwargs)

    Model.__init__ = model_init


def _check_model(st: LoopState, bound: inspect.BoundArguments) -> None:
    """Before MindSpore builds the train cell (which may raise on the device's rules)."""
    manager = bound.arguments.get("kwargs", {}).get("loss_scale_manager")
    opt = bound.arguments.get("optimizer")
    from .loss_scale import loss_scale_findings

    rank = rank_and_world()[0]
    for f in loss_scale_findings(manager, opt, str(ms.get_context("device_target")), rank):
        RunDir(st.settings.run_dir).append_event({"type": "finding", **f.to_dict()})


def _patch_dataset(st: LoopState) -> None:
    from mindspore.dataset.engine.iterators import Iterator

    orig = Iterator.__next__
    clock = time.perf_counter

    def __next__(self: Any) -> Any:
        if not st.listening:
            return orig(self)
        t0 = clock()
        out = orig(self)
        _guard(st, "dataset hook", st.data_wait, out, clock() - t0)
        return out

    Iterator.__next__ = __next__
