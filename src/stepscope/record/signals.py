"""Finalise the records on SIGTERM without making the training process unkillable.

A Python-level signal handler runs only when the main thread returns to the interpreter.
A worker blocked in a C++ collective (gloo, NCCL) never does, so a plain handler turned
torchrun's SIGTERM into "ignored" and its shutdown waited for minutes. Here:

* the handler chains: when the main thread runs it, the records are closed, then the
  previous handler runs (a callable), or the signal's default action (death by SIGTERM,
  the exit status torchrun and schedulers expect);
* a watcher thread is woken through :func:`signal.set_wakeup_fd` (written by the C-level
  handler even while the main thread is blocked): it closes the records (bounded by
  :data:`CLOSE_TIMEOUT_S`), restores the default action and re-raises SIGTERM, so a
  blocked process still dies of the signal, promptly, with its records flushed.

Nothing is installed over a handler the script set (or SIG_IGN), outside the main
thread, or when another user of the wakeup fd exists (asyncio): then the default stays.
The finaliser never changes how the job ends otherwise:

* a handler the script installs later (a preemption checkpoint set after its first step)
  replaces ours and is honoured: the watcher acts only while our handler is the one
  installed, so the script's handler runs and the records close however the script then
  ends (``atexit``: after its handler);
* a forked child (a DataLoader or dataset worker, an ``os.fork`` helper) does not inherit
  it: the wakeup fd is written by whichever process receives the signal, so a child's
  SIGTERM (a worker ended at shutdown) used to wake the parent's watcher and kill the
  trainer. After ``os.fork`` the child gets SIGTERM's default action and no wakeup fd
  (``os.register_at_fork``, with SIGTERM blocked around the fork; a fork made in C
  without Python's hooks is not covered).

Example::

    install_sigterm_finaliser(lambda: rec.close("failed", "terminated by SIGTERM"))
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

__all__ = ["install_sigterm_finaliser", "CLOSE_TIMEOUT_S"]

# Closing flushes the writer thread's queue and writes run.json: well under a second
# normally; a hung disk must not keep a process alive past its scheduler's grace period.
CLOSE_TIMEOUT_S = 5.0


class _Finaliser:
    def __init__(self, close: Callable[[], None]) -> None:
        self.close = close
        self.once = threading.Lock()
        self.done = threading.Event()

    def finish(self) -> None:
        """Close the records once, bounded in time (a daemon thread does the work); a
        second caller (handler and watcher both woke) waits for the first one's close."""
        if self.once.acquire(blocking=False):
            threading.Thread(target=self._close_quietly, daemon=True,
                             name="stepscope-sigterm-close").start()
        self.done.wait(CLOSE_TIMEOUT_S)

    def _close_quietly(self) -> None:
        try:
            self.close()
        except Exception:  # measuring must never change how training ends
            pass
        finally:
            self.done.set()


def _die_of_sigterm_from_thread() -> None:
    """Default action for SIGTERM (``signal.signal`` is main-thread only), then raise it."""
    try:
        setsig = ctypes.pythonapi.PyOS_setsig
        setsig.argtypes = [ctypes.c_int, ctypes.c_void_p]
        setsig.restype = ctypes.c_void_p
        setsig(signal.SIGTERM, None)  # SIG_DFL
        os.kill(os.getpid(), signal.SIGTERM)
    except Exception:
        os._exit(128 + signal.SIGTERM)  # same status a shell reports for the signal


def _watch(fd: int, fin: _Finaliser, ours: Callable[..., None]) -> None:
    while True:
        try:
            data = os.read(fd, 64)
        except OSError:
            return
        if not data:
            return
        # One byte per signal number delivered. Acted on only while our handler is the
        # installed one: a handler the script set since then decides (see the docstring).
        if signal.SIGTERM in data and signal.getsignal(signal.SIGTERM) is ours:
            fin.finish()
            _die_of_sigterm_from_thread()
            return


class _ForkGuard:
    """``os.register_at_fork`` hooks: a forked child keeps neither the wakeup fd (the
    parent's pipe) nor the handler (the parent's records). SIGTERM is blocked in the
    forking thread around the fork, so a child signalled before its hook ran (a helper
    started and ``terminate()``d at once) gets the signal only once the hook restored the
    default action: it dies of it as it would without stepscope, and writes nothing to the
    parent's pipe. The parent's own SIGTERM meanwhile waits the few microseconds of the
    fork (or reaches another of its threads: the watcher's)."""

    def __init__(self, r: int, w: int, ours: Callable[..., None]) -> None:
        self.r, self.w, self.ours = r, w, ours
        self.mask: set[int | signal.Signals] | None = None

    def register(self) -> None:
        os.register_at_fork(before=self.before, after_in_parent=self.unblock,
                            after_in_child=self.after_in_child)

    def before(self) -> None:
        self.mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def unblock(self) -> None:
        if self.mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)
            self.mask = None

    def after_in_child(self) -> None:
        try:
            old = signal.set_wakeup_fd(-1)
            if old not in (self.w, -1):
                signal.set_wakeup_fd(old)  # a fd the child set up itself since: kept
            if signal.getsignal(signal.SIGTERM) is self.ours:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except (ValueError, OSError):  # forked from a thread of a non-main interpreter
            pass
        for fd in (self.r, self.w):
            try:
                os.close(fd)
            except OSError:
                pass
        self.unblock()  # a SIGTERM that came meanwhile is delivered now: default action


def install_sigterm_finaliser(close: Callable[[], None]) -> bool:
    """Install the chaining handler and the watcher (see the module docstring)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    prev = signal.getsignal(signal.SIGTERM)
    if prev is not signal.SIG_DFL:
        return False  # the script's own handler (or SIG_IGN) decides
    fin = _Finaliser(close)

    owner = os.getpid()

    def handler(signum: int, frame: FrameType | None) -> None:
        if os.getpid() == owner:  # a forked child signalled before its hook: no close
            fin.finish()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, handler)
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (ValueError, OSError):
        old = -2
    if old != -1:  # someone else listens on the wakeup fd (asyncio): leave theirs, and
        if old >= 0:  # keep the default action, so that a blocked process stays killable
            signal.set_wakeup_fd(old)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.close(r)
        os.close(w)
        return False
    _ForkGuard(r, w, handler).register()
    threading.Thread(target=_watch, args=(r, fin, handler), daemon=True,
                     name="stepscope-sigterm").start()
    return True
