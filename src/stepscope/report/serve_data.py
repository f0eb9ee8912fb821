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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..analysis.compare import compare_runs
from ..analysis.diagnose import diagnose
from ..analysis.series import series_doc
from ..analysis.summary import Sheet
from ..errors import RunDirError, StepscopeError
from ..findings import Finding
from ..rundir.index import INDEX_FILE, stored_sheet
from ..rundir.store import ReadStats, RunDir
from ..schema import RunMeta, StepTable
from .regimes_view import sheet_text
from .serve_index import RunList
from .serve_pages import PageCache, run_key
from .serve_partial import PARTIAL_BYTES, SAMPLE_BYTES, Partial, Samples

__all__ = ["Dashboard", "NotFound", "series_doc", "run_doc", "latest_profile"]

# Events the run page shows (the rest of events.jsonl is the tools' own bookkeeping).
_SHOWN_EVENTS = ("finding", "alert", "isolation", "profile", "warning", "cross_rank")
_CACHE_RUNS = 8  # loaded runs kept in memory (a page polls the run it shows)
# ... and the bytes their tables may hold together: past it the oldest go (the newest stays).
_CACHE_BYTES = 2 << 30


class NotFound(StepscopeError):
    """A run path the index does not list (or a request for something else that is absent)."""


@dataclass
class _Loaded:
    signature: tuple[float, int]
    meta: RunMeta
    table: StepTable
    sheet: Sheet
    problems: list[str]
    skipped: int
    read: ReadStats
    findings: list[Finding] | None = None  # diagnosed on first request (the slow part)

    @property
    def nbytes(self) -> int:
        """What the table can hold: 8 bytes a row a column. Not the arrays' own sizes: a
        table from the step cache reads a column when first used, and asking every column
        its size read them all (2 s and 1.6 GB for a 1,000,000 x 8 run)."""
        return 8 * len(self.table) * len(self.table.columns)


def _dir_signature(path: Path) -> tuple[float, int]:
    """Newest mtime and total size under steps/ and of the run's files: a cheap change test."""
    newest, size = 0.0, 0
    for p in [path / "run.json", path / "events.jsonl", *sorted((path / "steps").glob("*"))]:
        try:
            st = p.stat()
        except OSError:
            continue
        newest, size = max(newest, st.st_mtime), size + st.st_size
    return newest, size


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
        self._cache: OrderedDict[str, _Loaded] = OrderedDict()
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
    def _load(self, rel: str) -> _Loaded:
        path = self._path_of(rel)
        with self._lock:
            gate = self._loading.setdefault(rel, threading.Lock())
        with gate:
            return self._load_locked(rel, path)

    def _load_locked(self, rel: str, path: Path) -> _Loaded:
        sig = _dir_signature(path)
        with self._lock:
            hit = self._cache.get(rel)
            if hit is not None and hit.signature == sig:
                self._cache.move_to_end(rel)
                return hit
        run = RunDir.open(path)
        meta = run.read_meta()
        table, stats = run.read_steps()
        sheet = stored_sheet(run, meta, table, stats)  # the index's, while files are as then
        loaded = _Loaded(sig, meta, table, sheet, list(stats.problems), stats.skipped, stats)
        with self._lock:
            self._cache[rel] = loaded
            held = sum(x.nbytes for x in self._cache.values())
            while len(self._cache) > _CACHE_RUNS or (held > _CACHE_BYTES
                                                     and len(self._cache) > 1):
                held -= self._cache.popitem(last=False)[1].nbytes
        self._samples.done(rel)  # its sample, if it had one, is not needed any more
        return loaded

    def _page(self, rel: str, kind: str, query: tuple[Any, ...], build: Any
              ) -> dict[str, Any]:
        """``build()``'s document, from the page cache when the run's files are as they
        were; kept there unless the run is still being written."""
        key = run_key(self._path_of(rel), *query)
        doc = self._pages.get(rel, kind, key)
        if doc is None:
            doc = build()
            if doc.get("status", (doc.get("meta") or {}).get("status")) != "running" \
                    and not doc.get("partial"):
                self._pages.put(rel, kind, key, doc)
        return doc

    def _sampled(self, rel: str) -> Partial | None:
        """The sample of a run whose full read is long and under way (serve_partial), or
        None: the run is in memory, or quick to read."""
        path = self._path_of(rel)
        sig = _dir_signature(path)
        with self._lock:
            hit = self._cache.get(rel)
            if hit is not None and hit.signature == sig:
                return None
        return self._samples.get(rel, RunDir.open(path), sig, lambda: self._load(rel))

    def run(self, rel: str, with_findings: bool = True) -> dict[str, Any]:
        """Sheet, events, identity and environment, the latest profile, and (unless
        ``with_findings`` is false: the page asks for them after its first paint) findings.
        Without findings, a long run nothing of which is cached yet answers from a sample
        first (``"partial"``; serve_partial)."""
        def build() -> dict[str, Any]:
            part = None if with_findings else self._sampled(rel)
            if part is not None:
                doc = run_doc(rel, RunDir.open(self._path_of(rel)), part.table, part.meta,
                              part.sheet, [], [], None)
                return {**doc, "partial": part.info}
            loaded = self._load(rel)
            return run_doc(rel, RunDir.open(self._path_of(rel)), loaded.table, loaded.meta,
                           loaded.sheet, loaded.problems, [], loaded.read)

        doc = self._page(rel, "run", (), build)
        if with_findings:
            doc = {**doc, "findings": self.findings(rel)["findings"]}
        return doc

    def findings(self, rel: str) -> dict[str, Any]:
        """diagnose's findings of one run (cached with the loaded run, and on disk)."""
        def build() -> dict[str, Any]:
            loaded = self._load(rel)
            found = self._findings(rel, loaded, RunDir.open(self._path_of(rel)))
            return {"path": rel, "findings": [f.to_dict() for f in found],
                    "status": loaded.meta.status}

        return self._page(rel, "findings", (), build)

    def _findings(self, rel: str, loaded: _Loaded, run: RunDir) -> list[Finding]:
        with self._lock:
            gate = self._diagnosing.setdefault(rel, threading.Lock())
        with gate:
            if loaded.findings is None:
                events, _ = run.read_events()
                loaded.findings = (diagnose(loaded.table, loaded.meta, events=events,
                                            conditions=run.read_conditions()).findings
                                   if len(loaded.table) else [])
            return loaded.findings

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
            loaded = self._load(rel)
            return series_doc(rel, loaded.table, loaded.sheet, loaded.meta, max_points,
                              heat_cols, steps)

        if steps is not None:  # a zoomed window: computed each time (its edge moves live)
            return build()
        return self._page(rel, "series", (max_points, heat_cols), build)

    def compare(self, rel_a: str, rel_b: str) -> dict[str, Any]:
        """The A/B verdict of ``stepscope compare`` for two runs of the index."""
        a, b = self._load(rel_a), self._load(rel_b)
        run_a, run_b = RunDir.open(self._path_of(rel_a)), RunDir.open(self._path_of(rel_b))
        result = compare_runs(a.table, a.meta, b.table, b.meta, run_a.read_events("eval")[0],
                              run_b.read_events("eval")[0])
        doc: dict[str, Any] = result.to_dict()
        doc["paths"] = [rel_a, rel_b]
        return doc


def run_doc(rel: str, run: RunDir, table: StepTable, meta: RunMeta, sheet: Sheet,
            problems: Sequence[str], findings: Sequence[Finding] | None = None,
            read: ReadStats | None = None) -> dict[str, Any]:
    """The run page's document: sheet, findings, shown events, identity, latest profile,
    the sheet's text as the terminal shows it, and what the reader skipped (``read``)."""
    events, _ = run.read_events()
    shown = [e for e in events if e.get("type") in _SHOWN_EVENTS]
    if findings is None:
        findings = (diagnose(table, meta, events=events,
                             conditions=run.read_conditions()).findings if len(table) else [])
    return {"path": rel, "meta": meta.to_dict(), "sheet": sheet.to_dict(),
            "findings": [f.to_dict() for f in findings], "events": shown[-200:],
            "read_problems": list(problems), "profile": latest_profile(run),
            "text": sheet_text(sheet),
            "read": {**read.to_dict(), "summary": read.summary()} if read else None}


def latest_profile(run: RunDir) -> dict[str, Any] | None:
    """The newest archived profile's analysis (written beside it by `stepscope run`)."""
    dirs = run.profile_dirs()
    for d in reversed(dirs):
        f = d.with_name(d.name + ".analysis.json")
        try:
            doc: dict[str, Any] = orjson.loads(f.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        doc["profile_dir"] = d.name
        return doc
    return {"profile_dir": dirs[-1].name, "status": "not analysed"} if dirs else None
