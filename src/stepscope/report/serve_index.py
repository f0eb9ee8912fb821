"""The dashboard's run list: the SQLite index of ROOT, brought up to date off the request.

Indexing a cold root reads every run's steps (seconds for a large root or a long run), so
the page does not wait for it: a request starts a refresh in a background thread when the
index is older than ``refresh_s`` and waits at most ``wait_s`` for it. Until the first
refresh is done, the runs are listed from their run.json alone (``pending`` rows: name,
status, model, devices, no numbers yet) and the page fills the numbers in as its periodic
reload finds them. Only paths found under ROOT (by the index or the same directory walk)
are ever served.

Example::

    runs = RunList(Path("runs"), refresh_s=2.0, wait_s=1.0)
    rows, skipped, indexing = runs.rows(where=["num_devices>=8"], sort="-mfu")
"""

from __future__ import annotations

import math
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import StepscopeError
from ..rundir.index import INDEX_FILE, _walk, build_index, query_index
from ..rundir.store import RunDir

__all__ = ["RunList", "background_priority"]

# The index's refresh yields the CPUs to the server's requests (and to a run page's full
# read, serve_partial): on a cold root of 1,000 runs its processes had the two cores of a
# small host, and the runs table's first paint waited seconds behind them (a run page's
# full read keeps the usual priority: it is what that page waits for).
INDEX_NICE = 10


def background_priority(increment: int) -> None:
    """Lower the calling thread's priority by ``increment`` (its nice value; the processes
    it forks inherit it). Linux only, where the nice value is a thread's own (elsewhere the
    same call would lower the whole server); best effort."""
    if not sys.platform.startswith("linux"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid,
                       min(19, os.getpriority(os.PRIO_PROCESS, tid) + increment))
    except OSError:
        pass


class RunList:
    """Index-backed list of the runs under ``root`` (thread-safe; see the module doc)."""

    def __init__(self, root: Path, refresh_s: float = 2.0, wait_s: float = 1.0) -> None:
        self.root = root
        self.db = root / INDEX_FILE
        self.refresh_s = refresh_s
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._indexed_at = -math.inf
        self._thread: threading.Thread | None = None
        self._done = threading.Event()  # the current refresh finished
        self._done.set()
        self._built = False
        self._error: Exception | None = None
        self._skipped: list[dict[str, str]] = []
        self._known: set[str] = set()
        self._walked: dict[str, dict[str, Any]] = {}
        if self.db.exists():  # an index of an earlier session is served meanwhile
            try:
                self._known = {r["path"] for r in query_index(self.db)}
                self._built = True
            except (StepscopeError, sqlite3.Error):
                pass  # another version's or a broken index: rebuilt by the first refresh

    def _refresh(self) -> None:
        background_priority(INDEX_NICE)  # a thread of its own: its priority only
        try:
            result = build_index(self.root, self.db)
            known = {r["path"] for r in query_index(self.db)}
            with self._lock:
                self._skipped = [{"path": s.path, "reason": s.reason} for s in result.skipped]
                self._known = known
                self._built, self._error = True, None
        except Exception as exc:  # answered to the next request, not lost in a thread
            with self._lock:
                self._error = exc
        finally:
            with self._lock:
                self._indexed_at = time.monotonic()
            self._done.set()

    def refresh(self, wait_s: float | None = None) -> None:
        """Start a refresh if the index is stale; wait up to ``wait_s`` for it."""
        with self._lock:
            stale = time.monotonic() - self._indexed_at >= self.refresh_s
            if stale and self._done.is_set():
                self._done.clear()
                self._thread = threading.Thread(target=self._refresh, daemon=True,
                                                name="stepscope-index")
                self._thread.start()
        self._done.wait(self.wait_s if wait_s is None else wait_s)
        with self._lock:
            error, self._error = self._error, None
        if isinstance(error, StepscopeError):
            raise error
        if error is not None:
            raise StepscopeError(f"indexing {self.root} failed: {type(error).__name__}: "
                                 f"{error}")

    def _walk_runs(self) -> dict[str, dict[str, Any]]:
        """Runs found by the index's own walk, listed from run.json (no step read)."""
        out: dict[str, dict[str, Any]] = {}
        for path, complete in _walk(self.root):
            if not complete:
                continue
            rel = path.relative_to(self.root).as_posix() or "."
            try:
                meta = RunDir(path).read_meta()
            except (StepscopeError, OSError, ValueError):
                continue  # the index lists it among the skipped, with the reason
            out[rel] = {"path": rel, "run_id": meta.run_id, "name": meta.name or meta.run_id,
                        "status": meta.status, "created_utc": meta.created_utc,
                        "model_name": meta.baseline.get("model_name"),
                        "num_devices": meta.baseline.get("num_devices"), "pending": True}
        with self._lock:
            self._walked = out
        return out

    def rows(self, where: Sequence[str] = (), sort: str | None = None
             ) -> tuple[list[dict[str, Any]], list[dict[str, str]], bool]:
        """(index rows matching ``where`` sorted by ``sort``, skipped runs, not indexed yet).
        Before the first refresh is done: every run from its run.json, newest first (a
        filter waits for the index: it may name any column)."""
        where = [w for w in where if w.strip()]
        self.refresh(None if not where else 600.0)
        with self._lock:
            built, skipped = self._built, list(self._skipped)
        if built:
            return query_index(self.db, where, sort=sort or None), skipped, False
        rows = sorted(self._walk_runs().values(), key=lambda r: str(r["created_utc"] or ""),
                      reverse=True)
        return rows, skipped, True

    def known(self, rel: str) -> bool:
        """Whether ``rel`` is a run the index (or the walk before it) found under ROOT; a
        path not seen yet waits for a refresh (a run created since the last one). A run
        listed already does not: its page's requests had each waited for the refresh in
        flight (up to ``wait_s``, several times a page), which the runs table's own polling
        starts every ``refresh_s``."""
        with self._lock:
            if rel in self._known or (not self._built and rel in self._walked):
                return True
        self.refresh()
        with self._lock:
            if rel in self._known or (not self._built and rel in self._walked):
                return True
        if not self._built and rel in self._walk_runs():
            return True
        self.refresh(600.0)
        with self._lock:
            return rel in self._known
