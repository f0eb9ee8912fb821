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
import errno
import os
import time
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson

from ..errors import RunDirError
from ..schema import RunMeta, StepTable
from .derived import derived_dir
from .meta_check import clean_meta
from .steps_decode import ReadStats, parse_jsonl
from .steps_table import StepRead

__all__ = ["RunDir", "ReadStats", "StepFileWriter", "is_run_dir", "utc_stamp"]

RUN_JSON = "run.json"
STEPS_DIR = "steps"
EVENTS_JSONL = "events.jsonl"
PROFILES_DIR = "profiles"
CONDITIONS_DIR = "conditions"
REPORT_HTML = "report.html"
ISOLATION_EVENT = "isolation"  # events.jsonl "type" of an isolation experiment's verdict
# Derived data only (the columnar step cache): safe to delete at any time.
CACHE_DIR = ".cache"

META_OPTS = orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY
# ENOSPC (disk full), EDQUOT (quota): the cases where run.json's reserve is used.
NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
# Spaces after run.json's JSON (valid trailing whitespace): the room the final status write
# may use when the disk is full. The final update adds status, error, records_dropped and
# a degraded note: well under 1 KiB; 2 KiB leaves room for a long error message.
META_RESERVE_BYTES = 2048
# Cross-rank side channel: each rank's latest window medians and rank 0's merged view.
CROSSRANK_DIR = "crossrank"
CROSS_VIEW = "view.json"


def meta_bytes(meta: RunMeta) -> bytes:
    """run.json's content: the JSON, then the reserve (see :data:`META_RESERVE_BYTES`)."""
    data = orjson.dumps(meta.to_dict(), option=META_OPTS, default=str) + b"\n"
    return data + b" " * META_RESERVE_BYTES + b"\n"


def overwrite_in_place(path: Path, data: bytes) -> bool:
    """Rewrite ``path`` within its current size (no new blocks); False if it does not fit."""
    try:
        size = path.stat().st_size
        if len(data) + 1 > size:
            return False
        fd = os.open(path, os.O_WRONLY)
        try:  # same length as before: the file keeps its blocks, nothing is allocated
            os.pwrite(fd, data + b"\n" + b" " * (size - len(data) - 1), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        return False
    return True


def claim_step_file(base: Path) -> Path:
    """A step file this process alone writes: ``base`` (``rank-N.jsonl``), made exclusively.

    When it exists already (another process resolved the same rank, or the run is
    resumed), the file is ``rank-N.p<pid>.jsonl`` (then ``...p<pid>-<k>``): two
    processes never append to one file, and readers key rows by the rank inside them.
    An unwritable directory gives ``base``; the writer counts what it drops.
    """
    stem = base.name.removesuffix(".jsonl")
    names = [base.name] + [f"{stem}.p{os.getpid()}{f'-{k}' if k else ''}.jsonl"
                           for k in range(100)]
    for name in names:
        path = base.with_name(name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            return path
        except FileExistsError:
            continue
        except OSError:
            return base
    return base


class StepFileWriter:
    """Appends pre-built records to one rank's JSONL file; never raises ``OSError``.

    Each ``write`` is one ``os.write`` of whole lines on an ``O_APPEND`` descriptor, so a
    crash leaves at most one torn line at the end, which readers skip. A failed write drops
    its records whole (a partial write is cut back, so no torn line is left mid-file) and
    counts them in ``dropped``; ``first_error`` keeps the first reason. The next write tries
    again, so recording resumes when space returns.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self.failed = False
        self.dropped = 0
        self.first_error: str | None = None

    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return self._fd

    def write(self, records: Iterable[Mapping[str, Any]]) -> int:
        # orjson writes NaN/inf as null, which readers load back as NaN.
        lines = [orjson.dumps(r) for r in records]
        if not lines:
            return 0
        data = b"\n".join(lines) + b"\n"
        start = -1
        try:
            fd = self._open()
            start = os.lseek(fd, 0, os.SEEK_END)
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
        except OSError as exc:
            self.dropped += len(lines)
            self._cut_back(start)
            if not self.failed:
                self.failed = True
                self.first_error = f"{type(exc).__name__}: {exc}"
                warnings.warn(
                    f"stepscope: cannot write step records to {self.path} ({exc}); "
                    "training continues, records are being dropped",
                    RuntimeWarning, stacklevel=2,
                )
            self.close()
            return 0
        return len(lines)

    def _cut_back(self, size: int) -> None:
        """Drop the part of a failed write that reached the file (a torn mid-file line)."""
        if self._fd is None or size < 0:
            return
        try:
            os.ftruncate(self._fd, size)
        except OSError:
            pass

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None


class CrossRankFiles:
    """The cross-rank side channel in a run directory (``RunDir`` inherits it): files,
    never a collective (see ``stepscope.record.crossrank.FileExchange``)."""

    path: Path

    def _cross_path(self, name: str) -> Path:
        return self.path / CROSSRANK_DIR / name

    def _replace_json(self, dest: Path, payload: Mapping[str, Any]) -> bool:
        """Atomically replace ``dest`` with ``payload``; False (and no temp file) on error."""
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY,
                                         default=str))
            os.replace(tmp, dest)
        except OSError:
            tmp.unlink(missing_ok=True)
            return False
        return True

    def _load_json(self, path: Path) -> dict[str, Any] | None:
        try:
            obj = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        return obj if isinstance(obj, dict) else None

    def publish_rank_window(self, rank: int, payload: Mapping[str, Any]) -> bool:
        """This rank's latest cross-rank window (``crossrank/rank-N.json``, replaced whole)."""
        return self._replace_json(self._cross_path(f"rank-{rank:05d}.json"), payload)

    def rank_windows(self) -> dict[int, dict[str, Any]]:
        """Every rank's latest published window; unreadable or half-written files are
        skipped (the writer replaces atomically, so a reader sees old or new, not a mix)."""
        out: dict[int, dict[str, Any]] = {}
        for f in sorted((self.path / CROSSRANK_DIR).glob("rank-*.json")):
            rank = f.name[len("rank-"):-len(".json")]
            obj = self._load_json(f)
            if rank.isdigit() and obj is not None:
                out[int(rank)] = obj
        return out

    def publish_cross_view(self, event: Mapping[str, Any]) -> bool:
        """The merged view (rank 0's latest ``cross_rank`` event) every rank can read."""
        return self._replace_json(self._cross_path(CROSS_VIEW), event)

    def cross_view(self) -> dict[str, Any] | None:
        return self._load_json(self._cross_path(CROSS_VIEW))


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
