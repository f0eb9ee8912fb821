"""The run directory: the only code that touches one.

Layout (one directory per run; many runs under one root)::

    RUN/
      run.json                 identity + baseline fingerprint + environment
      steps/rank-00000.jsonl   append-only step records, one JSON object per line
      events.jsonl             health findings, alerts, isolation-experiment results
      profiles/<UTC-timestamp>/  archived profiler outputs
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
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from .errors import RunDirError
from .schema import STEP_COLUMN_NAMES, AnyArray, RunMeta, StepTable

__all__ = ["RunDir", "ReadStats", "StepFileWriter", "is_run_dir", "utc_stamp"]

RUN_JSON = "run.json"
STEPS_DIR = "steps"
EVENTS_JSONL = "events.jsonl"
PROFILES_DIR = "profiles"
REPORT_HTML = "report.html"


def utc_stamp(now: _dt.datetime | None = None) -> str:
    """UTC timestamp usable as a directory name, sortable: 20261130T101500.123Z."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return now.strftime("%Y%m%dT%H%M%S.") + f"{now.microsecond // 1000:03d}Z"


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    return (Path(path) / RUN_JSON).is_file()


@dataclass
class ReadStats:
    """What a reader skipped: counts per file, and the first few reasons."""

    records: int = 0
    skipped: int = 0
    torn_tail: int = 0
    files: int = 0
    problems: list[str] = field(default_factory=list)

    def note(self, problem: str) -> None:
        self.skipped += 1
        if len(self.problems) < 20:
            self.problems.append(problem)


class StepFileWriter:
    """Appends pre-built records to one rank's JSONL file; never raises ``OSError``.

    Each ``write`` is one ``os.write`` of whole lines on an ``O_APPEND`` descriptor, so a
    crash leaves at most one torn line at the end, which readers skip.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self.failed = False
        self.dropped = 0

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
        try:
            fd = self._open()
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
        except OSError as exc:
            self.dropped += len(lines)
            if not self.failed:
                self.failed = True
                warnings.warn(
                    f"stepscope: cannot write step records to {self.path} ({exc}); "
                    "training continues, records are being dropped",
                    RuntimeWarning, stacklevel=2,
                )
            self.close()
            return 0
        return len(lines)

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None


def _parse_jsonl(data: bytes, source: str, stats: ReadStats) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    lines = data.split(b"\n")
    last = len(lines) - 1
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            if i == last:  # no newline after it: the writer died mid-line
                stats.torn_tail += 1
                stats.note(f"{source}: torn last line (partial write), skipped")
            else:
                stats.note(f"{source}:{i + 1}: corrupt record, skipped")
            continue
        if not isinstance(obj, dict):
            stats.note(f"{source}:{i + 1}: record is not a JSON object, skipped")
            continue
        rows.append(obj)
    return rows


# Non-finite values are written as these strings (JSON has no NaN/inf literals).
_NONFINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def _is_value(v: Any) -> bool:
    return ((isinstance(v, (int, float)) and not isinstance(v, bool))
            or (isinstance(v, str) and v in _NONFINITE))


def _column(vals: list[Any]) -> tuple[AnyArray, AnyArray | None]:
    """Float column from record values, and a flag column where an explicit NaN was read."""
    out = np.empty(len(vals), dtype=np.float64)
    flags = None
    for i, v in enumerate(vals):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[i] = v
        elif isinstance(v, str) and v in _NONFINITE:
            out[i] = _NONFINITE[v]
            if v == "NaN":
                if flags is None:
                    flags = np.zeros(len(vals), dtype=np.float64)
                flags[i] = 1.0
        else:  # None (not recorded) or a value of the wrong type
            out[i] = np.nan
    return out, flags


def _rows_to_table(rows: list[dict[str, Any]], source: str, stats: ReadStats) -> StepTable:
    names: dict[str, None] = dict.fromkeys(STEP_COLUMN_NAMES)
    good: list[dict[str, Any]] = []
    merged: dict[tuple[Any, Any], dict[str, Any]] = {}
    for i, r in enumerate(rows):
        if not isinstance(r.get("step"), int) or not isinstance(r.get("rank", 0), int):
            stats.note(f"{source}: record {i + 1} has no integer 'step'/'rank', skipped")
            continue
        for k in [k for k, v in r.items() if v is not None and not _is_value(v)]:
            r.pop(k)  # non-numeric values cannot live in a float column
        key = (r.get("rank", 0), r["step"])
        prev = merged.get(key)
        if prev is None:
            merged[key] = r
            good.append(r)
        else:  # a late record (values logged after the step closed): merge into it
            prev.update({k: v for k, v in r.items() if v is not None})
        names.update(dict.fromkeys(r))
    cols: dict[str, AnyArray] = {}
    for name in names:
        vals = [r.get(name) for r in good]
        if name in ("rank", "step"):
            cols[name] = np.array([v if v is not None else 0 for v in vals], dtype=np.int64)
            continue
        cols[name], flags = _column(vals)
        if flags is not None:
            cols[f"{name}_nan"] = flags
    stats.records += len(good)
    return StepTable(cols)


class RunDir:
    """Handle on one run directory. ``create`` makes one, ``open`` validates one."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

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

    def read_meta(self) -> RunMeta:
        try:
            raw = orjson.loads(self.meta_path.read_bytes())
            return RunMeta.from_dict(raw)
        except FileNotFoundError as exc:
            raise RunDirError(f"{self.meta_path} is missing") from exc
        except (orjson.JSONDecodeError, ValueError, TypeError) as exc:
            raise RunDirError(
                f"{self.meta_path} is corrupt ({exc}); the step records may still be read "
                "with `stepscope report --ignore-meta`"
            ) from exc
        except OSError as exc:
            raise RunDirError(f"cannot read {self.meta_path}: {exc}") from exc

    def write_meta(self, meta: RunMeta) -> None:
        """Atomic replace, so a reader never sees a half-written run.json."""
        tmp = self.meta_path.with_name(f".{RUN_JSON}.{os.getpid()}.tmp")
        try:
            tmp.write_bytes(orjson.dumps(meta.to_dict(), option=orjson.OPT_INDENT_2
                                         | orjson.OPT_SERIALIZE_NUMPY, default=str))
            os.replace(tmp, self.meta_path)
        except OSError as exc:
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

    def read_steps(self) -> tuple[StepTable, ReadStats]:
        """All ranks' step records as one table ordered by (rank, step)."""
        stats = ReadStats()
        tables = []
        for f in self.step_files():
            stats.files += 1
            try:
                data = f.read_bytes()
            except OSError as exc:
                stats.note(f"{f.name}: unreadable ({exc}), skipped")
                continue
            rows = _parse_jsonl(data, f.name, stats)
            tables.append(_rows_to_table(rows, f.name, stats))
        return StepTable.concat(tables).sorted(), stats

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
        rows = _parse_jsonl(data, EVENTS_JSONL, stats)
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
