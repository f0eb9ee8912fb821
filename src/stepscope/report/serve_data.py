"""The dashboard's JSON documents, built from a root of runs (no HTTP here).

``Dashboard`` keeps the SQLite index of ROOT up to date (at most once per ``refresh_s``) and
answers four questions: which runs are there (``runs``), one run's sheet, findings, events,
environment and latest profile (``run``), its per-step series for the charts (``series``),
and an A/B comparison of two runs (``compare``). A run is named by its path relative to ROOT
exactly as the index lists it, so nothing outside ROOT can be asked for.

Example::

    board = Dashboard("runs")
    board.runs(where=["num_devices>=8"], sort="-mfu")["runs"][0]["path"]
    board.series("exp1", max_points=2000)["series"]["result/loss"]
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..analysis.series import series_doc
from ..analysis.summary import Sheet
from ..errors import RunDirError, StepscopeError
from ..findings import Finding
from ..rundir.index import INDEX_FILE
from ..rundir.run import Run
from .regimes_view import sheet_text
from .serve_index import RunList
from .serve_pages import PageCache
from .serve_partial import PARTIAL_BYTES, SAMPLE_BYTES, Partial, Samples

__all__ = ["Dashboard", "NotFound", "run_doc"]

# Events the run page shows (the rest of events.jsonl is the tools' own bookkeeping).
_SHOWN_EVENTS = ("finding", "alert", "isolation", "profile", "warning", "cross_rank")
_CACHE_RUNS = 8  # opened runs kept in memory (a page polls the run it shows)
# ... and the bytes their tables may hold together: past it the oldest go (the newest stays).
_CACHE_BYTES = 2 << 30


class NotFound(StepscopeError):
    """A run path the index does not list (or a request for something else that is absent)."""


def _nbytes(run: Run) -> int:
    """What a run's table can hold: 8 bytes a row a column (0 while unread). Not the
    arrays' own sizes: a table from the step cache reads a column when first used, and
    asking every column its size read them all (2 s and 1.6 GB for a 1,000,000 x 8 run)."""
    table = run.loaded_table
    return 0 if table is None else 8 * len(table) * len(table.columns)


class Dashboard:
    """Index-backed view of ROOT for the web app (thread-safe; see the module docstring)."""

    def __init__(self, root: str | Path, refresh_s: float = 2.0, index_wait_s: float = 0.25,
                 partial_bytes: int | None = PARTIAL_BYTES, sample_bytes: int = SAMPLE_BYTES
                 ) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise RunDirError(f"{self.root} is not a directory; pass the folder that holds "
                              "the runs (or one run directory)")
        self.db = self.root / INDEX_FILE
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        # The index, refreshed off the request; a request waits index_wait_s at most.
        self._runs = RunList(self.root, refresh_s, index_wait_s)
        self._pages = PageCache(self.root)
        self._cache: OrderedDict[str, Run] = OrderedDict()
        # One loader per run at a time: the page asks for a run's sheet and series at once,
        # and the second request should wait for the first read, not read it again.
        self._loading: dict[str, threading.Lock] = {}
        # Diagnosing (seconds on a long run) has a lock of its own: a page opened meanwhile
        # must not wait for the findings of the one before to load its charts.
        self._diagnosing: dict[str, threading.Lock] = {}
        # A long run nothing of which is cached: first paint from a sample (serve_partial).
        self._samples = Samples(partial_bytes, sample_bytes)

    # -- the run list ------------------------------------------------------------------
    def runs(self, where: Sequence[str] = (), sort: str | None = None, q: str = ""
             ) -> dict[str, Any]:
        """Index rows matching ``where`` (the ``index --where`` language) and the text ``q``
        (``indexing``: the first index is not built yet, the rows are ``pending``: no
        numbers, listed from run.json)."""
        rows, skipped, indexing = self._runs.rows(where, sort)
        needle = q.strip().lower()
        if needle:
            rows = [r for r in rows if any(needle in str(r.get(k) or "").lower()
                                           for k in ("path", "name", "run_id", "model_name"))]
        for r in rows:
            r["valid"] = bool(r.get("steps")) or bool(r.get("pending"))
        return {"root": str(self.root), "runs": rows, "skipped": skipped,
                "indexing": indexing}

    def _path_of(self, rel: str) -> Path:
        if not self._runs.known(rel):
            raise NotFound(f"no run {rel!r} under {self.root}")
        return self.root if rel == "." else self.root / rel

    # -- one run -----------------------------------------------------------------------
    def _open(self, rel: str) -> Run:
        """The run as its files are now: the one in memory while they are unchanged
        (``Run.changed``, the key every reader uses), else opened again. Not behind the
        run's read gate: a sample is answered while the full read goes on."""
        path = self._path_of(rel)
        with self._lock:
            hit = self._cache.get(rel)
        if hit is not None and not hit.changed():
            with self._lock:
                if rel in self._cache:
                    self._cache.move_to_end(rel)
            return hit
        run = Run.open(path)
        with self._lock:
            self._cache[rel] = run
            self._cache.move_to_end(rel)
        return run

    def _load(self, rel: str) -> Run:
        """The run with its table read (one reader per run at a time: the page asks for
        a run's sheet and series at once, and the second request waits for the first)."""
        run = self._open(rel)
        with self._lock:
            gate = self._loading.setdefault(rel, threading.Lock())
        with gate:  # the table, and the sheet every full document shows
            if len(run.read(require=False)[0]):
                run.sheet()
        with self._lock:
            held = sum(_nbytes(x) for x in self._cache.values())
            while len(self._cache) > _CACHE_RUNS or (held > _CACHE_BYTES
                                                     and len(self._cache) > 1):
                held -= _nbytes(self._cache.popitem(last=False)[1])
        self._samples.done(rel)  # its sample, if it had one, is not needed any more
        return run

    def _page(self, rel: str, kind: str, query: tuple[Any, ...], build: Any
              ) -> dict[str, Any]:
        """``build()``'s document, from the page cache when the run's files are as they
        were; kept there unless the run is still being written."""
        run = self._open(rel)
        doc = self._pages.get(rel, kind, run.key, query)
        if doc is None:
            doc = build()
            if doc.get("status", (doc.get("meta") or {}).get("status")) != "running" \
                    and not doc.get("partial"):
                self._pages.put(rel, kind, run.key, query, doc)
        return doc

    def _sampled(self, rel: str) -> Partial | None:
        """The sample of a run whose full read is long and under way (serve_partial), or
        None: the run is in memory, or quick to read."""
        run = self._open(rel)
        if run.loaded_table is not None and run.known_sheet() is not None:
            return None
        return self._samples.get(rel, run, lambda: self._load(rel))

    def run(self, rel: str, with_findings: bool = True) -> dict[str, Any]:
        """Sheet, events, identity and environment, the latest profile, and (unless
        ``with_findings`` is false: the page asks for them after its first paint) findings.
        Without findings, a long run nothing of which is cached yet answers from a sample
        first (``"partial"``; serve_partial)."""
        def build() -> dict[str, Any]:
            part = None if with_findings else self._sampled(rel)
            if part is not None:
                doc = run_doc(rel, self._open(rel), [], sheet=part.sheet, read=False)
                return {**doc, "partial": part.info}
            return run_doc(rel, self._load(rel), [])

        doc = self._page(rel, "run", (), build)
        if with_findings:
            doc = {**doc, "findings": self.findings(rel)["findings"]}
        return doc

    def findings(self, rel: str) -> dict[str, Any]:
        """The run's findings (``Run.findings``: cached with the run, and on disk)."""
        def build() -> dict[str, Any]:
            run = self._load(rel)
            with self._lock:
                gate = self._diagnosing.setdefault(rel, threading.Lock())
            with gate:  # a page opened meanwhile need not wait for them to draw its charts
                found = run.findings() if len(run.table) else []
            return {"path": rel, "findings": [f.to_dict() for f in found],
                    "status": run.meta.status}

        return self._page(rel, "findings", (), build)

    def series(self, rel: str, max_points: int = 2000, heat_cols: int = 600,
               steps: tuple[int, int | None] | None = None) -> dict[str, Any]:
        """Per-step series (min/max envelopes past ``max_points``), x axes, phases, heatmap;
        ``steps`` = (first, last) inclusive narrows them to a zoomed window, so a zoom shows
        the window at full resolution rather than the whole run's bins (last None: up to
        the newest step)."""
        def build() -> dict[str, Any]:
            part = None if steps is not None else self._sampled(rel)
            if part is not None:
                doc = series_doc(rel, part.table, part.sheet, part.meta, max_points,
                                 heat_cols)
                return {**doc, "partial": part.info}
            run = self._load(rel)
            if not len(run.table):
                return series_doc(rel, run.table, _empty_sheet(run), run.meta, max_points,
                                  heat_cols, steps)
            return {**run.series(max_points, heat_cols, steps), "path": rel}

        if steps is not None:  # a zoomed window: computed each time (its edge moves live)
            return build()
        return self._page(rel, "series", (max_points, heat_cols), build)

    def compare(self, rel_a: str, rel_b: str) -> dict[str, Any]:
        """Exactly the document ``stepscope compare A B --json`` prints (``Run.compare``)."""
        return self._open(rel_a).compare_doc(self._open(rel_b))


def _empty_sheet(run: Run) -> Sheet:
    from ..analysis.summary import summarize

    return summarize(run.table, run.meta)


def run_doc(rel: str, run: Run, findings: Sequence[Finding], *, sheet: Sheet | None = None,
            read: bool = True) -> dict[str, Any]:
    """The run page's document: sheet, findings, shown events, identity, latest profile,
    the sheet's text as the terminal shows it, and (``read``) what the reader skipped.
    ``sheet``: another sheet than the run's (a sample's, for a first paint)."""
    if sheet is None:
        sheet = run.sheet() if len(run.table) else _empty_sheet(run)
    shown = [e for e in run.events() if e.get("type") in _SHOWN_EVENTS]
    stats = run.stats if read else None
    return {"path": rel, "meta": run.meta.to_dict(), "sheet": sheet.to_dict(),
            "findings": [f.to_dict() for f in findings], "events": shown[-200:],
            "read_problems": list(stats.problems) if stats else [],
            "profile": run.profile(), "text": sheet_text(sheet),
            "read": {**stats.to_dict(), "summary": stats.summary()} if stats else None}
