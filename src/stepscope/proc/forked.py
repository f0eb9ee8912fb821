"""One computation in a forked child process while this one goes on (one-shot commands).

After a cold read, a command's analysis runs on one CPU while the other is idle: ``report``
summarizes the run (the sheet) and diagnoses it (the findings), two computations that share
nothing but the table. :class:`Forked` runs one of them in a child forked from this
process, which sees the table without a copy (the pages are shared until written), and
hands back its result through a pipe (pickled: findings are a few kB).

Whatever goes wrong in the child, the result is computed here instead, as it would have
been without the child: no fork (no ``fork`` start method, no memory for one, a limit on
processes), the child dying (killed, out of memory), raising (the error is raised here, by
the same code, with its traceback), a result that does not pickle, or no answer within
``patience`` of this process asking for it (a lock some other thread held at the fork).
The child is a daemon, killed when this process asks no more (and, on Linux, when this
process dies), so it never outlives the command.

Only stepscope's own one-shot commands use it (``report``, ``export``): never the training
process, the dashboard or a caller's notebook, whose threads a fork could catch holding a
lock.

Example::

    job = Forked(diagnose, table, meta, events=events)
    sheet = summarize(table, meta)          # here, while the child diagnoses
    findings = job.result().findings
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Generic, TypeVar

__all__ = ["Forked", "worth_it", "MIN_ROWS", "MAX_ROWS"]

T = TypeVar("T")

# A step table's analysis is split over a child for MIN_ROWS to MAX_ROWS rows. Below, the
# work moved takes less time than starting a child (tens of milliseconds). Above, the child
# reads the columns it uses from the cache itself (up to the 256 MB of resident columns a
# process keeps) and makes its own temporaries: at 2 million rows it held ~400 MB of its
# own beside the parent's 582 MB peak; beside the ~1.5 GB of a 9.6-million-row report it
# would pass the 2 GB a command must stay under.
MIN_ROWS = 200_000
MAX_ROWS = 4_000_000

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """Linux: the kernel kills this process when its parent dies (best effort); a parent
    gone before that was asked (this process adopted by another) ends it now."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != parent:
        os._exit(1)


def _child(conn: Connection, parent: int, fn: Callable[..., Any], args: tuple[Any, ...],
           kwargs: dict[str, Any]) -> None:
    _die_with_parent(parent)
    try:
        out: tuple[str, Any] = ("ok", fn(*args, **kwargs))
    except BaseException:  # computed again in the parent, which raises it
        out = ("failed", None)
    try:
        conn.send(out)
    except Exception:  # the result does not pickle: the parent computes it
        with contextlib.suppress(Exception):
            conn.send(("failed", None))
    finally:
        conn.close()


def _joined(proc: Any) -> bool:
    """The child, its result sent, exits at once; True when it did."""
    proc.join(5.0)
    return not proc.is_alive()


def worth_it(rows: int) -> bool:
    """Whether the analysis of a table of ``rows`` rows runs beside other processes' work:
    a forked child's (``report``), or another run's read (``compare``, whose workers hold
    their own memory meanwhile)."""
    return MIN_ROWS <= rows <= MAX_ROWS


class Forked(Generic[T]):
    """``fn(*args, **kwargs)`` computed in a forked child; :meth:`result` returns it (see
    the module docstring). ``fork=False``: no child, ``result`` computes it here.
    ``patience``: seconds ``result`` waits for the child (at least as long as it has
    already had) before computing it here."""

    def __init__(self, fn: Callable[..., T], *args: Any, fork: bool = True,
                 patience: float = 30.0, **kwargs: Any) -> None:
        self._fn, self._args, self._kwargs = fn, args, kwargs
        self._patience = patience
        self._proc: Any = None
        self._conn: Connection | None = None
        self._started = time.monotonic()
        if not fork or "fork" not in mp.get_all_start_methods():
            return
        ctx = mp.get_context("fork")
        recv, send = ctx.Pipe(duplex=False)
        try:
            proc = ctx.Process(target=_child, args=(send, os.getpid(), fn, args, kwargs),
                               daemon=True, name="stepscope-forked")
            proc.start()
        except OSError:  # no fork here: computed in this process
            recv.close()
            return
        finally:
            send.close()  # the child's end: EOF here when the child is gone
        self._proc, self._conn = proc, recv

    @property
    def forked(self) -> bool:
        """Whether a child is computing it (False: ``result`` computes it here)."""
        return self._proc is not None

    def result(self) -> T:
        """The child's result, or, when it has none to give, the same computed here."""
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if proc is None or conn is None:
            return self._fn(*self._args, **self._kwargs)
        status, value = "failed", None
        try:
            wait = max(self._patience, time.monotonic() - self._started)
            if conn.poll(wait):
                status, value = conn.recv()
        except Exception:  # the child died, or sent what does not unpickle here
            status = "failed"
        finally:
            conn.close()
            if status != "ok" or not _joined(proc):
                proc.kill()
                proc.join()
        if status == "ok":
            return value  # type: ignore[return-value]
        return self._fn(*self._args, **self._kwargs)

    def __enter__(self) -> Forked[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the child, if any, without its result."""
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if conn is not None:
            conn.close()
        if proc is not None:
            if proc.is_alive():
                proc.kill()
            proc.join()
