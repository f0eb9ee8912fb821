"""Analysis results kept with the step cache, reused while the run's files are unchanged.

A warm ``report``, ``diagnose`` or ``compare`` of a finished run re-read and re-analysed
every record (9.6 million at the field report's size: 20-40 s) to print the same numbers
again. What those commands compute from a run (the sheet and its per-rank lines, the
findings, the rendered page with its per-window series, a comparison) is data: it is kept
as JSON under ``RUN/.cache/summary/``, one file per command and parameters, keyed by

* every file of the run directory (run.json, steps/, events.jsonl, conditions, profiles;
  not ``.cache/``, ``report.html`` or hidden files, which the commands write themselves):
  a file up to 64 KiB by its content, a larger one by inode, size and mtime (the rule the
  step cache and ``index`` use);
* a digest of stepscope's own source files (names, sizes, mtimes) and of the numpy and
  Python versions (a changed rule or median is recomputed, never served stale);
* the command's parameters.

Like the step cache it is never the source of truth: a missing, stale, corrupt or foreign
entry is a miss, the result is computed from the records and stored again. An entry is
stored only when the files were the same before and after it was computed (a writer
appending meanwhile leaves no entry), and a write that fails (read-only run, full disk)
leaves none either. Values survive JSON as the ``--json`` documents print them (orjson:
floats exactly, NaN as null).

Example::

    entry = Stored([run.path], "diagnose", {})
    doc = entry.get()
    if doc is None:
        doc = compute()
        entry.put(doc)
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from .derived import make_real_dirs, open_derived, real_dirs, replace_from_tmp

__all__ = ["Stored", "SUMMARY_DIR", "run_files_identity", "run_state"]

SUMMARY_DIR = "summary"
_FORMAT = "stepscope-summary-2"
# Written by the commands themselves: never an input of an analysis.
_OUTPUTS = frozenset({".cache", "report.html"})
_DUMP = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
# Files up to this size are identified by their content, larger ones by their stat.
_SMALL_FILE = 64 << 10


@functools.cache
def code_digest() -> str:
    """Digest of stepscope's source files (name, size, mtime: an edit or another install
    changes it; stat, not read: a warm command must not re-read the sources it imported)
    and the numeric stack's versions."""
    h = hashlib.sha1(f"{np.__version__}|{sys.version}".encode())
    root = Path(__file__).parent
    for p in sorted(root.rglob("*.py")):
        try:
            st = p.stat()
            mark = f"{st.st_size}:{st.st_mtime_ns}"
        except OSError:
            mark = "?"
        h.update(f"{p.relative_to(root).as_posix()}\0{mark}\0".encode())
    return h.hexdigest()


def run_files_identity(path: Path) -> list[list[Any]] | None:
    """``[relative path, *identity]`` of every input file of a run directory, and
    ``[relative path + "/"]`` of every folder (a new, still empty profile archive is a
    change), in a fixed order; None when it cannot be listed."""
    out: list[list[Any]] = []
    try:
        for dirpath, dirnames, filenames in os.walk(path, onerror=_raise):
            top = Path(dirpath) == path
            dirnames[:] = sorted(d for d in dirnames
                                 if not (top and (d in _OUTPUTS or d.startswith("."))))
            rel = Path(dirpath).relative_to(path).as_posix()
            out.extend([f"{rel}/{d}/"] for d in dirnames)
            for name in sorted(filenames):
                if top and (name in _OUTPUTS or name.startswith(".")):
                    continue
                out.append([f"{rel}/{name}", *_identity(os.path.join(dirpath, name))])
    except OSError:
        return None
    return out


def run_state(path: Path) -> str | None:
    """The one "has this run changed" key: a digest of every input file's identity
    (``run_files_identity``); None when the directory cannot be listed or holds nothing."""
    ids = run_files_identity(Path(path))
    return _digest(ids) if ids else None


def _identity(path: str) -> list[Any]:
    """A small file by its content (run.json, a short events file: rewritten in place
    within one timestamp tick at the same size, it still differs); a larger one (step and
    condition files, appended) by inode, size and mtime, without reading it."""
    st = os.stat(path)
    if st.st_size > _SMALL_FILE:
        return [st.st_ino, st.st_size, st.st_mtime_ns]
    with open(path, "rb") as f:
        return [st.st_size, hashlib.sha1(f.read(_SMALL_FILE + 1)).hexdigest()]


def _raise(exc: OSError) -> None:
    raise exc


def _digest(obj: Any) -> str:
    return hashlib.sha1(orjson.dumps(obj, option=_DUMP, default=str)).hexdigest()


class Stored:
    """One stored result of ``runs`` (run directories; the first holds the entry) under
    ``name`` and ``params`` (JSON-able). ``get`` returns the document stored for the files
    as they are now, else None; ``put`` stores one when they are still as ``get`` saw them.
    """

    def __init__(self, runs: Sequence[Path], name: str, params: Any,
                 states: Sequence[str | None] | None = None) -> None:
        self._runs = [Path(r) for r in runs]
        self._params = params
        self._file = (self._runs[0] / ".cache" / SUMMARY_DIR
                      / f"{name}-{_digest([name, params])[:12]}.json")
        self._key = self._state(states)

    @property
    def key(self) -> str | None:
        """The state of the files this entry was made for (None: no usable state)."""
        return self._key

    def _state(self, states: Sequence[str | None] | None = None) -> str | None:
        """The entry's key: the runs' states (``run_state``; ``states`` when the caller
        has them), stepscope's code and the parameters."""
        now = list(states) if states is not None else [run_state(r) for r in self._runs]
        if any(s is None for s in now):
            return None
        return _digest([_FORMAT, code_digest(), self._params, now])

    def get(self) -> Any | None:
        if self._key is None:
            return None
        if not real_dirs(self._file.parent, 2):  # RUN/.cache or its summary/ a link
            return None
        try:
            with open_derived(self._file) as f:
                d = orjson.loads(f.read())
        except (OSError, orjson.JSONDecodeError):
            return None
        if not isinstance(d, dict) or d.get("format") != _FORMAT or d.get("key") != self._key:
            return None
        return d.get("doc")

    def put(self, doc: Any) -> bool:
        """Store ``doc``; False (nothing stored) when the files changed since this entry
        was made, it cannot be encoded, or it cannot be written."""
        if self._key is None or self._state() != self._key:
            return False
        try:
            data = orjson.dumps({"format": _FORMAT, "key": self._key, "doc": doc},
                                option=_DUMP, default=str)
            make_real_dirs(self._file.parent, 2)  # never through a link (see .derived)
            replace_from_tmp(self._file, lambda f: f.write(data))
        except (OSError, TypeError, orjson.JSONEncodeError):
            return False
        return True
