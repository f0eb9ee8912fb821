"""The experiment index: every run under a root in one SQLite table, kept up to date.

The field report asks to "index every experiment: framework version, profiler output path,
configuration, key metrics". ``build_index`` scans ROOT for run directories (reading them
only through the read door, :class:`stepscope.rundir.run.Run`), and stores one row per run:
identity, framework and stepscope versions, every baseline variable, the profile archive
paths and the key metrics of both ledgers (``Run.sheet`` for speed: the sheet ``report``
prints; last loss and the latest eval values for quality). Re-running is incremental: a run
whose state (``Run.key``, the key every reader uses) is as last time is not read again.
A corrupt or partial run is listed in ``skipped`` with the reason; it never aborts the scan.

Example::

    result = build_index("runs")                     # runs/.stepscope-index.sqlite
    rows = query_index(result.db_path, where=["num_devices=64"], sort="-mfu")
    best = best_config(result.db_path, ["model_name=gpt-7b", "num_devices=64"])
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..analysis.compare.quality import latest_evals
from ..analysis.summary import Sheet
from ..errors import ConfigError, RunDirError, StepscopeError
from ..proc.engine import map_items
from ..schema import BASELINE_FIELDS
from .results import run_state
from .run import Run
from .store import RunDir, is_run_dir, utc_stamp

__all__ = [
    "INDEX_FILE", "COLUMNS", "IndexStats", "Skipped", "IndexResult", "build_index",
    "query_index", "parse_where", "best_config", "skipped_runs",
]

INDEX_FILE = ".stepscope-index.sqlite"
# Bumped whenever the columns change; an index of another version is rebuilt from scratch.
SCHEMA_VERSION = 1

_IDENTITY = ("path", "run_id", "name", "created_utc", "status", "framework",
             "framework_version", "stepscope_version", "code_commit")
_METRICS = ("steps", "ranks", "step_time_s", "step_time_p90_s", "tokens_per_s",
            "samples_per_s", "tokens_per_s_per_device", "mfu", "hfu", "comm_frac",
            "comm_exposed_frac", "data_wait_frac", "mem_peak_bytes", "loss_last", "loss_min",
            "skipped_records")
_TAIL = ("profiles", "evals", "signature", "indexed_utc")
# Every column of the ``runs`` table, in order. Baseline variables keep their run.json names.
COLUMNS: tuple[str, ...] = _IDENTITY + tuple(BASELINE_FIELDS) + _METRICS + _TAIL
# Fewer changed runs than this are read in this process: a pool costs more than it saves.
_PARALLEL_MIN_RUNS = 16
# Metrics where the smaller value is the better configuration (for ``best_config``).
_LOWER_BETTER = {"step_time_s", "step_time_p90_s", "comm_frac", "comm_exposed_frac",
                 "data_wait_frac", "mem_peak_bytes", "loss_last", "loss_min"}


@dataclass
class IndexStats:
    found: int = 0  # run directories and partial runs seen under ROOT
    read: int = 0  # runs (re)read because new or changed
    unchanged: int = 0  # runs whose files were unchanged: not read
    removed: int = 0  # rows dropped because the run is gone
    skipped: int = 0  # corrupt or partial runs


@dataclass(frozen=True)
class Skipped:
    path: str
    reason: str


@dataclass
class IndexResult:
    db_path: Path
    stats: IndexStats
    skipped: list[Skipped] = field(default_factory=list)


# -- scanning ----------------------------------------------------------------------------
def _walk(root: Path) -> Iterator[tuple[Path, bool]]:
    """(directory, is_complete_run) for run directories and partial ones (no run.json)."""
    for dirpath, dirs, _files in os.walk(root):
        here = Path(dirpath)
        if is_run_dir(here):
            dirs[:] = []
            yield here, True
        elif "steps" in dirs and any((here / "steps").glob("rank-*.jsonl")):
            dirs[:] = []
            yield here, False
        else:
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))


def _stat(path: Path) -> str:
    try:
        st = path.stat()
    except OSError:
        return "-"
    return f"{st.st_size}:{st.st_mtime_ns}"


def _scalar(value: Any) -> Any:
    """SQLite holds numbers and text; anything else is stored as its JSON text."""
    if value is None or isinstance(value, (int, float, str)):
        return value
    return orjson.dumps(value, default=str).decode()


def _sheet(run: Run) -> Sheet:
    """The run's sheet (``Run.sheet``: from its results store while its files are
    unchanged), or the one-line reason a run without steps is skipped."""
    sheet = run.known_sheet()
    if sheet is not None:
        return sheet
    table, stats = run.read(require=False)
    if not len(table):
        raise RunDirError(f"no step records yet ({stats.files} step files, "
                          f"{stats.skipped} corrupt records)")
    return run.sheet()


def _read_row(run: Run, rel: str, signature: str) -> dict[str, Any]:
    meta = run.meta
    sheet = _sheet(run)
    env = meta.environment
    row: dict[str, Any] = {
        "path": rel, "run_id": meta.run_id, "name": meta.name or meta.run_id,
        "created_utc": meta.created_utc, "status": meta.status,
        "framework": env.get("framework"), "framework_version": env.get("framework_version"),
        "stepscope_version": env.get("stepscope_version"), "code_commit": env.get("code_commit"),
    }
    row.update({k: _scalar(meta.baseline.get(k)) for k in BASELINE_FIELDS})
    sd = sheet.to_dict()
    row.update({k: sd.get(k) for k in _METRICS if k in sd})
    devices = meta.baseline.get("num_devices") or sheet.ranks or 1
    row["tokens_per_s_per_device"] = (sheet.tokens_per_s / float(devices)
                                      if sheet.tokens_per_s else None)
    evals = {name: by_step[max(by_step)]
             for name, by_step in latest_evals(run.events("eval")).items()}
    row["profiles"] = _scalar([str(p.relative_to(run.path)) for p in run.dir.profile_dirs()])
    row["evals"] = _scalar(evals)
    row["signature"] = signature
    row["indexed_utc"] = utc_stamp()
    return row


# -- the database --------------------------------------------------------------------------
# A second `stepscope index` on the same root waits this long for the other's write
# (sqlite's default of 5 s failed as "database is locked" on a slow scan).
BUSY_TIMEOUT_S = 120.0
# SQLite's WAL needs shared memory between the processes, which network file systems do
# not give (sqlite.org/wal.html, "WAL does not work over a network filesystem").
_NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph",
               "glusterfs", "9p", "afs")


def _on_network_fs(path: Path) -> bool:
    """True if ``path`` lies on a network file system per /proc/mounts (False if unknown)."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return False
    target, best, kind = str(path.resolve().parent), "", ""
    for line in mounts:
        parts = line.split()
        if len(parts) >= 3 and (target == parts[1] or target.startswith(
                parts[1].rstrip("/") + "/")) and len(parts[1]) > len(best):
            best, kind = parts[1], parts[2]
    return kind in _NETWORK_FS or kind.startswith("fuse.")


def _connect(db_path: Path, create: bool = True) -> sqlite3.Connection:
    try:
        con = sqlite3.connect(db_path, timeout=BUSY_TIMEOUT_S)
        if create:
            if not _on_network_fs(db_path):
                con.execute("PRAGMA journal_mode=WAL")  # readers never wait for a scan
            con.execute("BEGIN IMMEDIATE")  # one process at a time checks/creates tables
        version = con.execute("PRAGMA user_version").fetchone()[0]
    except sqlite3.Error as exc:
        raise RunDirError(f"cannot open the index {db_path}: {exc}; pass --db to put it "
                          "somewhere writable") from exc
    if version != SCHEMA_VERSION and not create:
        con.close()
        raise RunDirError(f"{db_path} was written by another stepscope version (index "
                          f"schema {version}, expected {SCHEMA_VERSION}); rebuild it with "
                          "`stepscope index ROOT`")
    if version != SCHEMA_VERSION:
        con.execute("DROP TABLE IF EXISTS runs")  # not executescript: it would commit
        con.execute("DROP TABLE IF EXISTS skipped")
        cols = ", ".join(f'"{c}"' + (" TEXT PRIMARY KEY" if c == "path" else "")
                         for c in COLUMNS)
        con.execute(f"CREATE TABLE runs ({cols})")  # column names are ours, not user text
        con.execute("CREATE TABLE skipped (path TEXT PRIMARY KEY, reason TEXT, "
                    "signature TEXT)")
        con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    con.commit()
    return con


def _plan_one(con: sqlite3.Connection, root: Path, path: Path, complete: bool,
              known: dict[str, str], result: IndexResult) -> tuple[str, str] | None:
    """(relative path, signature) of a run to (re)read, or None when nothing is to read."""
    rel = path.relative_to(root).as_posix() or "."
    stats = result.stats
    if not complete:
        reason = "partial run: step records but no run.json"
        with con:
            con.execute("INSERT OR REPLACE INTO skipped VALUES (?, ?, ?)", (rel, reason, ""))
        result.skipped.append(Skipped(rel, reason))
        stats.skipped += 1
        return None
    sig = run_state(path) or "-"  # the one "has this run changed" key (Run.key)
    if known.get(rel) == sig:
        stats.unchanged += 1
        return None
    stats.read += 1
    return rel, sig


def _row_or_reason(task: tuple[str, str, str]) -> tuple[str, dict[str, Any] | str]:
    """One run's index row, or why it was skipped: the unit of work of an engine. Read
    outside any transaction, so a concurrent indexer is not held up meanwhile."""
    path, rel, sig = task
    try:
        return rel, _read_row(Run(RunDir(path), key=sig), rel, sig)
    except StepscopeError as exc:
        return rel, str(exc)
    except Exception as exc:  # a reader bug on one corrupt run must not abort the scan
        return rel, f"unreadable ({type(exc).__name__}: {exc})"


def _store(con: sqlite3.Connection, rel: str, sig: str, row: dict[str, Any] | str) -> None:
    if isinstance(row, str):
        _skip(con, rel, row, sig)
        return
    with con:  # one short transaction per run
        con.execute("DELETE FROM skipped WHERE path = ?", (rel,))
        marks = ", ".join("?" for _ in COLUMNS)
        con.execute(f"INSERT OR REPLACE INTO runs VALUES ({marks})",
                    [row.get(c) for c in COLUMNS])


def _skip(con: sqlite3.Connection, rel: str, reason: str, sig: str) -> None:
    with con:
        con.execute("DELETE FROM runs WHERE path = ?", (rel,))
        con.execute("INSERT OR REPLACE INTO skipped VALUES (?, ?, ?)", (rel, reason, sig))


def build_index(root: str | os.PathLike[str], db_path: str | os.PathLike[str] | None = None,
                *, engine: str = "local", scheduler: str | None = None,
                processes: int | None = None) -> IndexResult:
    """Scan ``root`` and bring its index up to date; returns counts and skipped runs.

    The changed runs are read by ``engine`` (:mod:`stepscope.proc.engine`): ``local`` processes
    (serial for a few runs), or ``dask`` tasks on a new local cluster or the one at
    ``scheduler``, whose workers must see ROOT at the same path. Results are identical.

    Example::

        result = build_index("runs")
        result.stats.read, result.stats.unchanged, [s.reason for s in result.skipped]
    """
    root = Path(root)
    if not root.is_dir():
        raise RunDirError(f"{root} is not a directory; pass the folder that holds the runs")
    db = Path(db_path) if db_path is not None else root / INDEX_FILE
    result = IndexResult(db_path=db, stats=IndexStats())
    with closing(_connect(db)) as con, con:
        known = dict(con.execute("SELECT path, signature FROM runs").fetchall())
        known.update(con.execute("SELECT path, signature FROM skipped").fetchall())
        seen: set[str] = set()
        todo: list[tuple[str, str, str]] = []
        for path, complete in _walk(root):
            result.stats.found += 1
            seen.add(path.relative_to(root).as_posix() or ".")
            plan = _plan_one(con, root, path, complete, known, result)
            if plan is not None:
                todo.append((str(path), *plan))
        if engine == "local" and processes is None and len(todo) < _PARALLEL_MIN_RUNS:
            processes = 1
        sigs = {rel: sig for _, rel, sig in todo}
        for rel, row in map_items(_row_or_reason, todo, engine=engine, scheduler=scheduler,
                                  processes=processes):
            _store(con, rel, sigs[rel], row)
        gone = [p for p in known if p not in seen]
        for p in gone:
            con.execute("DELETE FROM runs WHERE path = ?", (p,))
            con.execute("DELETE FROM skipped WHERE path = ?", (p,))
        result.stats.removed = len(gone)
        result.skipped = [Skipped(p, r) for p, r in con.execute(
            "SELECT path, reason FROM skipped ORDER BY path")]
        result.stats.skipped = len(result.skipped)
    return result


# -- queries ---------------------------------------------------------------------------------
_WHERE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=|!=|==|=|<|>|~)\s*(.*?)\s*$")
_SQL_OPS = {"=": "=", "==": "=", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">=",
            "~": "LIKE"}


def _value(text: str) -> Any:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    low = text.lower()
    if low in ("true", "false"):
        return int(low == "true")
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def parse_where(expr: str) -> tuple[str, list[Any]]:
    """One filter ``COLUMN OP VALUE`` -> (SQL fragment, parameters); never interpolates.

    OP is one of = != < <= > >= and ~ (substring). The column must be an index column.

    Example::

        parse_where("num_devices=64")        # ('"num_devices" = ?', [64])
    """
    m = _WHERE.match(expr)
    if not m:
        raise ConfigError(f"cannot read the filter {expr!r}: expected COLUMN OP VALUE with "
                          "OP one of = != < <= > >= ~ (e.g. num_devices=64)")
    col, op, raw = m.groups()
    if col not in COLUMNS:
        raise ConfigError(f"unknown index column {col!r} in {expr!r}; columns: "
                          f"{', '.join(COLUMNS[:-2])}")
    if op == "~":
        escaped = raw.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        return f"\"{col}\" LIKE ? ESCAPE '\\'", [f"%{escaped}%"]
    return f'"{col}" {_SQL_OPS[op]} ?', [_value(raw)]


def _order(sort: str | None) -> str:
    if not sort:
        return '"created_utc" DESC, "path"'
    desc = sort.startswith("-")
    col = sort.lstrip("-+")
    if col not in COLUMNS:
        raise ConfigError(f"cannot sort by {col!r}: not an index column; prefix '-' sorts "
                          "descending (e.g. --sort -tokens_per_s)")
    return f'"{col}" IS NULL, "{col}" {"DESC" if desc else "ASC"}, "path"'


def _open_existing(db_path: str | os.PathLike[str]) -> sqlite3.Connection:
    if not Path(db_path).is_file():
        raise RunDirError(f"no index at {db_path}; build it with `stepscope index ROOT`")
    con = _connect(Path(db_path), create=False)
    con.row_factory = sqlite3.Row
    return con


def query_index(db_path: str | os.PathLike[str], where: Sequence[str] = (),
                sort: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """Rows of the index (dicts keyed by ``COLUMNS``) matching every filter, sorted.

    Example::

        query_index("runs/.stepscope-index.sqlite", ["num_devices>=8"], sort="-mfu")
    """
    clauses, params = [], []
    for expr in where:
        sql, p = parse_where(expr)
        clauses.append(sql)
        params += p
    sql = "SELECT * FROM runs" + (" WHERE " + " AND ".join(clauses) if clauses else "")
    sql += f" ORDER BY {_order(sort)}"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(int(limit))
    with closing(_open_existing(db_path)) as con:
        return [dict(r) for r in con.execute(sql, params)]


def skipped_runs(db_path: str | os.PathLike[str]) -> list[Skipped]:
    """The corrupt or partial runs the last ``build_index`` skipped, with reasons."""
    with closing(_open_existing(db_path)) as con:
        return [Skipped(r["path"], r["reason"])
                for r in con.execute("SELECT path, reason FROM skipped ORDER BY path")]


def best_config(db_path: str | os.PathLike[str], where: Sequence[str],
                metric: str = "mfu") -> tuple[dict[str, Any] | None, str]:
    """Best run for the filters (e.g. a model size and device count) and the metric used.

    MFU is the anchor (field report: tokens/s is not comparable across sizes and card
    counts); when no matching run recorded MFU, tokens/s per device ranks them instead.
    Failed runs never count.

    Example::

        row, used = best_config(db, ["num_params=7e9", "num_devices=64"])
    """
    filters = [*where, "status!=failed"]
    for m in dict.fromkeys([metric, "tokens_per_s_per_device"]):
        sort = m if m in _LOWER_BETTER else f"-{m}"
        rows = query_index(db_path, [*filters, f"{m}>=0"], sort=sort, limit=1)
        if rows:
            return rows[0], m
    return None, metric
