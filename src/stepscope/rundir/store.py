"""The run directory: the only code that touches one.

Layout (one directory per run; many runs under one root)::

    RUN/
      run.json                 identity + baseline fingerprint + environment
      steps/rank-00000.jsonl   append-only step records, one JSON object per line
      events.jsonl             health findings, alerts, isolation-experiment results
      profiles/<UTC-timestamp>/  archived profiler outputs
      crossrank/rank-00000.json  each rank's latest cross-rank window (side channel)
      report.html              latest rendered report

Readers never fail on a torn last line or a corrupt record: they skip it, count it and report
it in :class:`ReadStats`. Writers never raise into the training process: an ``OSError``
(full or read-only disk, deleted directory) is reported once through ``warnings`` and the
records are dropped and counted.

Example::

    run = RunDir.create("runs/exp1", RunMeta(run_id="exp1"))
    table, stats = RunDir.open("runs/exp1").read_steps()
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from ..errors import RunDirError
from ..schema import RunMeta, StepTable
from .derived import derived_dir
from .meta_check import clean_meta
from .steps_decode import ReadStats, parse_jsonl
from .steps_table import StepRead
from .write import (
    META_OPTS,
    NO_SPACE,
    CrossRankFiles,
    StepFileWriter,
    claim_step_file,
    meta_bytes,
    overwrite_in_place,
)

__all__ = ["RunDir", "ReadStats", "StepFileWriter", "is_run_dir", "utc_stamp"]

RUN_JSON = "run.json"
STEPS_DIR = "steps"
EVENTS_JSONL = "events.jsonl"
PROFILES_DIR = "profiles"
CONDITIONS_DIR = "conditions"
REPORT_HTML = "report.html"
# Derived data only (the columnar step cache): safe to delete at any time.
CACHE_DIR = ".cache"


def utc_stamp(now: _dt.datetime | None = None) -> str:
    """UTC timestamp usable as a directory name, sortable: 20261130T101500.123Z."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return now.strftime("%Y%m%dT%H%M%S.") + f"{now.microsecond // 1000:03d}Z"


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    return (Path(path) / RUN_JSON).is_file()


class RunDir(CrossRankFiles):
    """Handle on one run directory. ``create`` makes one, ``open`` validates one."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        # Fields of run.json dropped by the last ``read_meta`` (wrong type), one line each.
        self.meta_problems: list[str] = []

    # -- creation and metadata -------------------------------------------------------
    @classmethod
    def create(cls, path: str | os.PathLike[str], meta: RunMeta) -> RunDir:
        run = cls(path)
        try:
            (run.path / STEPS_DIR).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunDirError(f"cannot create run directory {run.path}: {exc}") from exc
        run.write_meta(meta)
        return run

    @classmethod
    def create_new(cls, path: str | os.PathLike[str], meta: RunMeta) -> RunDir:
        """Like :meth:`create`, but refuses a directory that already holds a run.

        run.json is linked into place (``os.link`` fails if the name exists), so of two
        processes creating the same run only one succeeds, and nothing of an earlier run
        (its run.json, its step files) is touched.
        """
        run = cls(path)
        if run.meta_path.exists() or run.step_files():
            raise RunDirError(
                f"{run.path} already holds a run; stepscope never overwrites one: pass "
                "another --out, or none for a new runs/<name>-<UTC timestamp> directory")
        try:
            (run.path / STEPS_DIR).mkdir(parents=True, exist_ok=True)
            tmp = run._write_tmp(meta)
            try:
                os.link(tmp, run.meta_path)
            finally:
                tmp.unlink(missing_ok=True)
        except FileExistsError as exc:
            raise RunDirError(f"{run.path} already holds a run (created meanwhile by "
                              "another process); pass another --out") from exc
        except OSError as exc:
            raise RunDirError(f"cannot create run directory {run.path}: {exc}") from exc
        return run

    @classmethod
    def for_recorder(cls, path: str | os.PathLike[str], meta: RunMeta, rank: int) -> RunDir:
        """The run a rank records into: rank 0 creates it or, when it exists (resumed, or
        pre-created by `stepscope run`), merges ``meta`` into it and marks it running;
        other ranks only make sure their step file's directory exists."""
        run = cls(path)
        if rank != 0:
            run.steps_path(rank).parent.mkdir(parents=True, exist_ok=True)
            return run
        if is_run_dir(run.path):
            try:
                old = run.read_meta()
                for key in ("baseline", "environment", "config"):
                    getattr(old, key).update(getattr(meta, key))
                old.status = "running"
                if meta.name:
                    old.name = meta.name
                run.write_meta(old)
                return run
            except Exception:  # corrupt run.json: start it anew, records are kept
                pass
        return cls.create(run.path, meta)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> RunDir:
        run = cls(path)
        if not run.path.exists():
            raise RunDirError(f"run directory {run.path} does not exist")
        if not run.path.is_dir():
            raise RunDirError(f"{run.path} is a file, expected a run directory")
        if not (run.path / RUN_JSON).is_file():
            raise RunDirError(
                f"{run.path} is not a run directory (no {RUN_JSON}); pass the directory "
                "that `stepscope demo`/`stepscope run` or stepscope.Recorder wrote"
            )
        run.read_meta()  # validates
        return run

    @property
    def meta_path(self) -> Path:
        return self.path / RUN_JSON

    @property
    def report_path(self) -> Path:
        return self.path / REPORT_HTML

    @property
    def events_path(self) -> Path:
        return self.path / EVENTS_JSONL

    def steps_path(self, rank: int) -> Path:
        return self.path / STEPS_DIR / f"rank-{rank:05d}.jsonl"

    def claim_steps_path(self, rank: int) -> Path:
        """A step file this process alone writes (see :func:`._runwrite.claim_step_file`)."""
        return claim_step_file(self.steps_path(rank))

    def conditions_path(self, rank: int) -> Path:
        """Host/device condition samples of one rank (see ``stepscope.record.conditions``)."""
        return self.path / CONDITIONS_DIR / f"rank-{rank:05d}.jsonl"

    def read_conditions(self) -> dict[int, list[dict[str, Any]]]:
        """Condition samples per rank, in file order; torn or corrupt lines skipped."""
        out: dict[int, list[dict[str, Any]]] = {}
        for f in sorted((self.path / CONDITIONS_DIR).glob("rank-*.jsonl")):
            try:
                rank = int(f.stem.removeprefix("rank-"))
                out[rank] = [obj for _, obj in parse_jsonl(f.read_bytes(), f.name, ReadStats())]
            except (OSError, ValueError):
                continue
        return out

    def read_meta(self) -> RunMeta:
        try:
            raw = orjson.loads(self.meta_path.read_bytes())
            cleaned, self.meta_problems = clean_meta(raw)
            for problem in self.meta_problems:
                warnings.warn(f"stepscope: {self.meta_path}: {problem}", RuntimeWarning,
                              stacklevel=2)
            return RunMeta.from_dict(cleaned)
        except FileNotFoundError as exc:
            raise RunDirError(f"{self.meta_path} is missing") from exc
        except (orjson.JSONDecodeError, ValueError, TypeError) as exc:
            raise RunDirError(
                f"{self.meta_path} is corrupt ({exc}); the step records in {STEPS_DIR}/ are "
                "untouched: restore run.json from a copy, or fix the JSON by hand"
            ) from exc
        except OSError as exc:
            raise RunDirError(f"cannot read {self.meta_path}: {exc}") from exc

    def _write_tmp(self, meta: RunMeta) -> Path:
        """run.json's new content in a temporary file beside it (removed on failure)."""
        tmp = self.meta_path.with_name(f".{RUN_JSON}.{os.getpid()}.tmp")
        try:
            tmp.write_bytes(meta_bytes(meta))
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp

    def write_meta(self, meta: RunMeta) -> None:
        """Atomic replace, so a reader never sees a half-written run.json.

        When the disk is full the temporary copy cannot be written; the new content then
        goes into run.json's own blocks (see :func:`_meta_bytes`: every run.json is padded
        to reserve them), so the final status of a run on a full disk is still recorded.
        No temporary file is left behind either way.
        """
        try:
            tmp = self._write_tmp(meta)
            os.replace(tmp, self.meta_path)
            return
        except OSError as exc:
            data = orjson.dumps(meta.to_dict(), option=META_OPTS, default=str)
            if exc.errno not in NO_SPACE or not overwrite_in_place(self.meta_path, data):
                raise RunDirError(f"cannot write {self.meta_path}: {exc}") from exc

    def update_meta(self, **changes: Any) -> RunMeta:
        """Merge ``changes`` into run.json; dict values are merged one level deep."""
        meta = self.read_meta()
        for key, value in changes.items():
            current = getattr(meta, key)
            if isinstance(current, dict) and isinstance(value, Mapping):
                current.update(value)
            else:
                setattr(meta, key, value)
        self.write_meta(meta)
        return meta

    def finish(self, status: str, error: str | None, records_dropped: int = 0,
               first_error: str | None = None, attempts: int = 3,
               retry_s: float = 0.5) -> RunMeta:
        """The final status write: run.json ``status``, ``error`` and the write losses.

        Losses go to ``config.records_dropped`` and, when any, a ``config.degraded`` note.
        Retried ``attempts`` times ``retry_s`` apart (space may come back, e.g. after a log
        rotation); raises :class:`RunDirError` when every attempt failed.
        """
        config: dict[str, Any] = {"records_dropped": int(records_dropped)}
        if records_dropped:
            config["degraded"] = (f"{records_dropped} step records lost to a write error"
                                  + (f" (first: {first_error})" if first_error else ""))
        for attempt in range(max(1, attempts)):
            try:
                return self.update_meta(status=status, error=error, config=config)
            except RunDirError:
                if attempt == max(1, attempts) - 1:
                    raise
                time.sleep(retry_s)
        raise AssertionError("unreachable")  # pragma: no cover

    def report_loss(self, rank: int, records_dropped: int, first_error: str | None) -> None:
        """One ``write_error`` event: a rank's cumulative count of records it could not write."""
        self.append_event({"type": "write_error", "rank": int(rank),
                           "records_dropped": int(records_dropped), "first_error": first_error})

    def write_report(self, html: str, out: str | os.PathLike[str] | None = None) -> Path:
        """Write the rendered report to ``report.html`` (or ``out``); atomic replace."""
        path = Path(out) if out is not None else self.report_path
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(html, encoding="utf-8")
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise RunDirError(f"cannot write {path}: {exc}") from exc
        return path

    # -- step records ----------------------------------------------------------------
    def step_files(self) -> list[Path]:
        return sorted((self.path / STEPS_DIR).glob("rank-*.jsonl"))

    @property
    def cache_dir(self) -> Path:
        """Derived columnar data (never the source of truth; safe to delete)."""
        return self.path / CACHE_DIR

    def read_steps(self, *, cache: bool = True, processes: int | None = None
                   ) -> tuple[StepTable, ReadStats]:
        """All ranks' step records as one table ordered by (rank, step).

        Records are validated (see :mod:`stepscope.rundir.steps_decode`): skipped records and
        dropped values are counted per reason in the returned :class:`ReadStats`.
        ``cache``: keep and use the incremental columnar cache under ``RUN/.cache/steps``
        (rebuilt whenever it does not match the step files; best effort when the run
        directory is read-only). ``processes``: worker processes for many large rank files
        (default: CPUs when worth it; 1 = serial).
        """
        return self.start_read_steps(cache=cache, processes=processes).result()

    def start_read_steps(self, *, cache: bool = True, processes: int | None = None
                         ) -> StepRead:
        """``read_steps``, started: worker processes decode the rank files while the
        caller goes on; ``.result()`` waits and returns (table, stats). Use it in a
        ``with`` block (or call ``.result()``): the workers end with it.

        Example::

            with run_b.start_read_steps() as pending:
                ...                               # work on run A meanwhile
                table_b, stats_b = pending.result()
        """
        # None when RUN/.cache or RUN/.cache/steps is a link: read without the cache.
        cache_dir = derived_dir(self.path, CACHE_DIR, STEPS_DIR) if cache else None
        return StepRead(self.step_files(), cache_dir, processes)

    # -- events ----------------------------------------------------------------------
    def append_event(self, event: Mapping[str, Any]) -> None:
        record = dict(event)
        record.setdefault("time_utc", _dt.datetime.now(_dt.timezone.utc).isoformat())
        line = orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY, default=str) + b"\n"
        try:
            fd = os.open(self.events_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        except OSError as exc:
            warnings.warn(f"stepscope: cannot append to {self.events_path}: {exc}",
                          RuntimeWarning, stacklevel=2)

    def read_events(self, type: str | None = None) -> tuple[list[dict[str, Any]], ReadStats]:
        stats = ReadStats()
        try:
            data = self.events_path.read_bytes()
        except FileNotFoundError:
            return [], stats
        except OSError as exc:
            stats.note(f"{EVENTS_JSONL}: unreadable ({exc})")
            return [], stats
        stats.files = 1
        rows = [r for _, r in parse_jsonl(data, EVENTS_JSONL, stats)]
        stats.records = len(rows)
        if type is not None:
            rows = [r for r in rows if r.get("type") == type]
        return rows, stats

    # -- profiles --------------------------------------------------------------------
    def new_profile_dir(self, stamp: str | None = None) -> Path:
        d = self.path / PROFILES_DIR / (stamp or utc_stamp())
        d.mkdir(parents=True, exist_ok=True)
        return d

    def write_profile_file(self, directory: Path, name: str, data: bytes) -> Path:
        """Write ``name`` into ``directory`` (a profile archived under this run)."""
        dest = Path(directory) / name
        dest.write_bytes(data)
        return dest

    def write_profile_analysis(self, profile_dir: Path, analysis: Mapping[str, Any]) -> Path:
        """``profiles/<stamp>.analysis.json`` beside the capture (outside it, so trace
        readers never see it)."""
        dest = Path(profile_dir).with_name(Path(profile_dir).name + ".analysis.json")
        dest.write_bytes(orjson.dumps(dict(analysis), option=orjson.OPT_INDENT_2
                                      | orjson.OPT_SERIALIZE_NUMPY, default=str))
        return dest

    def profile_dirs(self) -> list[Path]:
        root = self.path / PROFILES_DIR
        return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
