"""Where per-item work runs: local processes (default) or a Dask distributed cluster.

``stepscope trace`` (one task per rank trace) and ``stepscope index`` (one task per changed
run) hand their items to :func:`map_items`. ``local`` is a process pool on this machine
(serial when there is too little work to pay for the processes); ``dask`` submits the same
function to a ``distributed`` scheduler -- a new ``LocalCluster`` of worker processes, or
the cluster at ``scheduler`` (``tcp://host:8786``), whose workers must see the same paths
(a shared filesystem). Dask is an install extra: ``pip install "stepscope[dask]"``.

The local cluster runs code sent to it as the user who started it, so it listens on
127.0.0.1 only and with mutual TLS under a key and certificate made for this run
(``distributed.security.Security.temporary()``, held in memory): a client without them
(another local user) cannot connect. Where that cannot be set up (no ``cryptography``),
``--engine dask`` without ``--scheduler`` is refused rather than started open.

Example::

    tables = map_items(kineto.read, files, engine="dask", scheduler="tcp://10.0.0.5:8786")
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from typing import Any, TypeVar

from ..errors import ConfigError

__all__ = ["ENGINES", "map_items", "dask_client"]

ENGINES: tuple[str, ...] = ("local", "dask")
T = TypeVar("T")
R = TypeVar("R")
# How long a client waits to reach a scheduler before the command gives up (seconds).
CONNECT_TIMEOUT_S = 30


def _local(fn: Callable[[T], R], items: Sequence[T], processes: int | None) -> list[R]:
    workers = min(len(items), processes or os.cpu_count() or 1)
    if workers <= 1:
        return [fn(x) for x in items]
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        return list(pool.map(fn, items, chunksize=max(1, len(items) // (4 * workers))))


def dask_client(stack: ExitStack, scheduler: str | None, processes: int | None) -> Any:
    """A ``distributed.Client`` (closed with ``stack``): to the cluster at ``scheduler``, or
    to a new ``LocalCluster`` of ``processes`` workers; ConfigError when Dask is missing or
    the scheduler cannot be reached. For work that keeps data on the workers (futures)."""
    return _client(stack, scheduler, processes)


def _client(stack: ExitStack, scheduler: str | None, processes: int | None) -> Any:
    try:  # an install extra, imported only when asked for (typed as Any: it has no stubs)
        dist: Any = importlib.import_module("distributed")
    except ImportError:
        raise ConfigError('--engine dask needs Dask distributed: pip install '
                          '"stepscope[dask]" (or "dask[distributed]")') from None
    try:
        if scheduler:
            return stack.enter_context(dist.Client(scheduler, timeout=CONNECT_TIMEOUT_S))
        cluster = stack.enter_context(dist.LocalCluster(
            n_workers=processes or min(4, os.cpu_count() or 1), threads_per_worker=1,
            processes=True, dashboard_address=None, host="127.0.0.1",
            protocol="tls://", security=_run_security()))
        return stack.enter_context(dist.Client(cluster, timeout=CONNECT_TIMEOUT_S))
    except (OSError, TimeoutError) as exc:
        where = scheduler or "a local cluster"
        raise ConfigError(f"cannot reach the Dask scheduler at {where}: {exc}; start one "
                          "with `dask scheduler` or drop --scheduler") from None


def _run_security() -> Any:
    """Mutual TLS for a local cluster, with a key and certificate made for this run."""
    try:
        security: Any = importlib.import_module("distributed.security").Security
        return security.temporary()
    except (ImportError, AttributeError) as exc:
        raise ConfigError("--engine dask without --scheduler starts a local cluster only "
                          f"with TLS authentication, which is unavailable here ({exc}): "
                          'pip install cryptography "distributed>=2.0", or pass '
                          "--scheduler") from None


def map_items(fn: Callable[[T], R], items: Sequence[T], *, engine: str = "local",
              scheduler: str | None = None, processes: int | None = None,
              client: Any = None) -> list[R]:
    """``[fn(x) for x in items]``, in order, computed by ``engine``.

    ``fn`` must be a module-level function (it is pickled to the workers).
    ``processes``: local worker processes (1 = serial) or LocalCluster workers.
    ``client``: an existing ``distributed.Client`` to use instead (engine ``dask``).
    """
    if engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")
    if scheduler and engine != "dask":
        raise ConfigError("--scheduler needs --engine dask")
    if not items:
        return []
    if engine == "local":
        return _local(fn, items, processes)
    with ExitStack() as stack:
        c = client if client is not None else _client(stack, scheduler, processes)
        futures = c.map(fn, list(items), pure=False)
        results: list[R] = c.gather(futures)
        return results
