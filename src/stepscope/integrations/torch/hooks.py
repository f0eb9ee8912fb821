"""The global PyTorch hooks of ``stepscope run`` (installed once per process).

Each hook body calls into :class:`.state.AutoState` and its parts inside
``try/except Exception``:
a failure is counted and warned about once, and the training call always goes through.

Installed:

* ``torch.optim.optimizer.register_optimizer_step_pre_hook`` / ``..._post_hook``;
* ``torch.nn.modules.module.register_module_forward_pre_hook`` / ``forward_hook``
  (``always_call=True`` keeps the nesting depth right when a forward raises);
* wrappers of ``torch.Tensor.backward``, ``torch.autograd.backward``,
  ``torch.nn.utils.clip_grad_norm_``, ``torch.amp.GradScaler.scale/update``,
  ``torch.manual_seed``, ``_BaseDataLoaderIter.__next__``;
* DDP: ``register_comm_hook`` wraps the user's hook with timing; a DDP model without one
  gets a timed all-reduce hook on its first forward; ``torch.distributed`` collectives
  are timed (FSDP2).
* ``sys.excepthook`` and ``atexit``: close the records with status failed/finished.
"""

from __future__ import annotations

import atexit
import functools
import sys
import weakref
from typing import Any

import torch

from ...record.signals import install_sigterm_finaliser
from . import closure, ddp, fingerprint, loops, run_notes
from .clipnorm import watch_clip_norms
from .replay import Replay
from .settings import Settings
from .state import AutoState

_NAN = float("nan")


def install(settings: Settings) -> AutoState:
    """The process state with every hook installed (torch is imported by now)."""
    st = AutoState(settings, torch)
    # DDP models given a timed comm hook (a weak set: nothing is stored on user modules)
    hooked: weakref.WeakSet[Any] = weakref.WeakSet()
    _plug_meta(st)
    _optimizer_hooks(st)
    _module_hooks(st, hooked)
    _autograd_hooks(st)
    _loader_hook(st)
    _misc_hooks(st)
    _ddp_hooks(st, hooked)
    _exit_hooks(st)
    return st


def _plug_meta(st: AutoState) -> None:
    """What the process does besides timing (:mod:`.fingerprint`), at the state's seams."""
    st.on_recorder = on_sigterm
    st.on_model = run_notes.note_model
    st.on_optimizer = lambda s, opt: fingerprint.note_optimizer(s.fp.baseline, opt)
    st.before_optimizer_step = run_notes.maybe_cross_rank
    st.after_boundary = run_notes.after_boundary
    st.before_close = lambda s: s.profile.stop()
    st.at_close = run_notes.write_summary


def _optimizer_hooks(st: AutoState) -> None:
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    clock = st.clock
    primary_now = [False]
    t0 = [0.0]

    def pre(opt: Any, args: Any, kwargs: Any) -> Any:
        new = None
        try:
            fn = closure.closure_of(args, kwargs)
            primary_now[0] = st.on_optimizer_pre(opt, has_closure=fn is not None)
            if fn is not None and primary_now[0]:
                new = closure.replace_closure(args, kwargs, st.loops.wrap_closure(fn))
        except Exception as exc:
            primary_now[0] = False
            st.failures.failed("optimizer pre-hook", exc)
        t0[0] = clock()
        return new  # None: the step's own arguments; else the timed closure in its place

    def post(opt: Any, args: Any, kwargs: Any) -> None:
        dt = clock() - t0[0]
        if not primary_now[0]:
            st.step.cur.optimizer += dt  # a secondary optimizer: its time, not a boundary
            return
        try:
            st.on_optimizer_post(dt)
        except SystemExit:
            raise
        except Exception as exc:
            st.failures.failed("optimizer post-hook", exc)

    register_optimizer_step_pre_hook(pre)
    register_optimizer_step_post_hook(post)


def _module_hooks(st: AutoState, hooked: weakref.WeakSet[Any]) -> None:
    from torch.nn.modules.module import (
        register_module_forward_hook,
        register_module_forward_pre_hook,
    )

    grad_enabled = torch.is_grad_enabled
    compiling = torch.compiler.is_compiling
    phase, lp, failed = st.phase, st.loops, st.failures.failed

    # Under torch.compile, Dynamo traces the module calls inside a compiled region
    # together with global hooks; is_compiling() is True while it traces, so stepscope's
    # Python stays out of the traced code and only the outermost, uncompiled call (the
    # OptimizedModule) is timed. Stack entries (.phases): 1 a counted call (autograd on),
    # 0 not counted, 2 the outermost call of an evaluation forward (see .between), 3 a loss
    # module computing that evaluation's loss (see .evalloss).
    def pre(module: Any, args: Any) -> None:
        if compiling() or phase.quiet:
            return
        counted = not phase.in_backward and grad_enabled()
        if not counted:
            phase.push(lp.eval_mark(module, args))
            return
        phase.push(1)
        if phase.depth == 0:
            try:
                st.on_forward_root(module, args)
                _maybe_ddp(hooked, module)
            except Exception as exc:
                failed("forward pre-hook", exc)
        phase.enter()

    def post(module: Any, args: Any, output: Any) -> None:
        if compiling() or phase.quiet:
            return
        mark = phase.pop()
        if mark is None:
            return
        if mark != 1:
            if mark == loops.EVAL_MARK:
                lp.eval_end(output)
            elif mark == loops.LOSS_MARK:
                lp.loss_end(output)
            return
        if phase.leave():
            try:
                st.on_forward_root_end()
            except Exception as exc:
                failed("forward hook", exc)

    register_module_forward_pre_hook(pre)
    register_module_forward_hook(post, always_call=True)


def _autograd_hooks(st: AutoState) -> None:
    clock, phase, failed = st.clock, st.phase, st.failures.failed

    def timed(orig: Any, first_tensor: Any) -> Any:
        @functools.wraps(orig)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if phase.in_backward:
                return orig(*args, **kwargs)
            tensor = first_tensor(args, kwargs)
            try:
                st.activity()
                st.before_backward(tensor)
                phase.begin("backward")
            except Exception as exc:
                failed("backward hook", exc)
            phase.backward(True)
            t0 = clock()
            try:
                return orig(*args, **kwargs)
            finally:
                phase.backward(False)
                try:
                    st.on_backward(tensor, clock() - t0)
                except Exception as exc:
                    failed("backward hook", exc)

        return wrapper

    def self_tensor(args: Any, kwargs: Any) -> Any:
        return args[0] if args else None

    def tensors_arg(args: Any, kwargs: Any) -> Any:
        t = args[0] if args else kwargs.get("tensors")
        if isinstance(t, (list, tuple)):
            return t[0] if len(t) == 1 else None
        return t

    torch.Tensor.backward = timed(torch.Tensor.backward, self_tensor)  # type: ignore[method-assign]
    torch.autograd.backward = timed(torch.autograd.backward, tensors_arg)


def _loader_hook(st: AutoState) -> None:
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    orig = _BaseDataLoaderIter.__next__
    clock = st.clock
    replay = Replay(st.settings.replay_batches) if st.settings.replay_data else None

    def __next__(self: Any) -> Any:
        t0 = clock()
        hit, batch = False, None
        if replay is not None:
            try:
                hit, batch = replay.take(self)  # StopIteration ends a replayed epoch
            except StopIteration:
                raise
            except Exception as exc:  # a replay failure falls back to the real loader
                st.failures.failed("data replay", exc)
        if not hit:
            batch = orig(self)  # the loader's own errors reach the script unchanged
            if replay is not None:
                replay.keep(self, batch)
        dt = clock() - t0
        try:
            st.on_batch(batch, dt)
        except Exception as exc:
            st.failures.failed("DataLoader hook", exc)
        return batch

    _BaseDataLoaderIter.__next__ = __next__  # type: ignore[method-assign]


def _misc_hooks(st: AutoState) -> None:
    def on_clip(norm: Any) -> None:
        try:
            st.clip.seen(norm)
        except Exception as exc:
            st.failures.failed("clip_grad_norm_ hook", exc)

    watch_clip_norms(on_clip)

    orig_seed = torch.manual_seed

    @functools.wraps(orig_seed)
    def manual_seed(seed: Any) -> Any:
        try:
            fingerprint._SEED.append(int(seed))
        except Exception:  # measuring must never break training
            pass
        return orig_seed(seed)

    torch.manual_seed = manual_seed
    _scaler_hooks(st, torch.amp.GradScaler)
    st.loops.install()


def _scaler_hooks(st: AutoState, scaler_cls: Any) -> None:
    orig_scale = scaler_cls.scale
    orig_update = scaler_cls.update

    @functools.wraps(orig_scale)
    def scale(self: Any, outputs: Any) -> Any:
        out = orig_scale(self, outputs)
        try:
            st.accum.scaled(self, out, outputs)
        except Exception as exc:
            st.failures.failed("GradScaler.scale hook", exc)
        return out

    @functools.wraps(orig_update)
    def update(self: Any, new_scale: Any = None) -> Any:
        try:
            # The optimizer step was skipped (inf/NaN gradients) when a step is still
            # open after GradScaler.step: close it here, flagged as an overflow.
            if st.step.open and st.step.cur.micro and self.is_enabled():
                st.boundary(overflow=True)
        except SystemExit:
            raise
        except Exception as exc:
            st.failures.failed("GradScaler.update hook", exc)
        return orig_update(self, new_scale)

    scaler_cls.scale = scale
    scaler_cls.update = update


def _ddp_hooks(st: AutoState, hooked: weakref.WeakSet[Any]) -> None:
    if not torch.distributed.is_available():
        return
    from torch.nn.parallel import DistributedDataParallel as DDP

    orig_register = DDP.register_comm_hook

    @functools.wraps(orig_register)
    def register_comm_hook(self: Any, state: object, hook: Any) -> Any:
        hooked.add(self)  # a weak set: nothing is stored on the user's module
        try:
            hook = ddp.timed_comm_hook(st.comm, hook, noop=st.settings.noop_grad_sync)
        except Exception as exc:
            st.failures.failed("DDP comm hook", exc)
        return orig_register(self, state, hook)

    DDP.register_comm_hook = register_comm_hook  # type: ignore[method-assign]
    ddp.patch_collectives(torch.distributed, st.comm)


def _maybe_ddp(hooked: weakref.WeakSet[Any], module: Any) -> None:
    """First forward of a DDP model with no comm hook: register a timed all-reduce."""
    if type(module).__name__ != "DistributedDataParallel":
        return
    if module in hooked:
        return
    hooked.add(module)
    module.register_comm_hook(None, None)  # -> wrapper above with the default all-reduce


def on_sigterm(st: AutoState) -> None:
    """Close the records (status failed) on SIGTERM, then die of it as before.

    torchrun ends the surviving workers with SIGTERM when one fails; without this their
    last half second of records (the writer's flush interval) would be lost. A worker
    blocked in a collective still dies at once (:mod:`stepscope.record.signals`: the close runs
    from a thread); a script's own SIGTERM handling is left alone.
    """
    install_sigterm_finaliser(lambda: st.close("failed", "terminated by SIGTERM"))


def _exit_hooks(st: AutoState) -> None:
    prev = sys.excepthook

    def excepthook(et: Any, e: Any, tb: Any) -> None:
        try:
            st.close("failed", f"{et.__name__}: {e}")
        except Exception:  # measuring must never break training
            pass
        prev(et, e, tb)

    sys.excepthook = excepthook

    def at_exit() -> None:
        try:
            st.close("finished", None)
        except Exception:  # measuring must never break training
            pass

    atexit.register(at_exit)
