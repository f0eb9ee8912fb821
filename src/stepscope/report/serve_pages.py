"""The run page's documents of finished runs, kept on disk beside the index.

A run page's first paint needs the sheet, the decimated series and (just after) the
findings: computed from the whole step table, that is the run's full read (a 1,000,000 x
8 run: ~2 GB in memory and tens of seconds). Once computed they are a few hundred KB, so
``PageCache`` writes them to ``ROOT/.stepscope-pages/`` under a key of the run's files
(sizes and mtimes of run.json, events.jsonl, the step files, profiles/ and conditions/),
the query and the stepscope version. A later server (or the same one after the run left
its memory) answers from the file without loading the table: first paint in milliseconds
and memory that does not grow with the run.

Derived data only, like the index: a stale or unreadable file is a miss; a read-only root
has no page cache; runs still being written are not kept (their key changes every step).

Example::

    pages = PageCache(Path("runs"))
    doc = pages.get("exp1", "series", key) or build()
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import orjson

from ..rundir.derived import make_real_dirs, open_derived, real_dirs, replace_from_tmp
from ..version import __version__

__all__ = ["PageCache", "PAGES_DIR", "run_key"]

PAGES_DIR = ".stepscope-pages"
_FORMAT = 2  # bump when a document changes (2: x axes at the drawn steps only)


def _stat(p: Path) -> list[int]:
    try:
        st = p.stat()
    except OSError:
        return [-1, -1]
    return [st.st_size, st.st_mtime_ns]


def run_key(path: Path, *query: Any) -> list[Any]:
    """What a run page's documents depend on: the run's files and the query."""
    files = [path / "run.json", path / "events.jsonl", path / "profiles", path / "conditions"]
    files += sorted((path / "steps").glob("rank-*.jsonl"))
    return [_FORMAT, __version__, [p.name for p in files], [_stat(p) for p in files],
            list(query)]


class PageCache:
    """Documents by (run path, kind), each stored with its key (see the module doc)."""

    def __init__(self, root: Path) -> None:
        self.dir = root / PAGES_DIR

    def _file(self, rel: str, kind: str) -> Path:
        return self.dir / f"{hashlib.sha1(rel.encode()).hexdigest()[:20]}.{kind}.json"

    def get(self, rel: str, kind: str, key: list[Any]) -> dict[str, Any] | None:
        if not real_dirs(self.dir, 1):  # a link there is never followed (rundir.derived)
            return None
        try:
            with open_derived(self._file(rel, kind)) as f:
                stored = orjson.loads(f.read())
        except (OSError, orjson.JSONDecodeError):
            return None
        if not isinstance(stored, dict) or stored.get("key") != key \
                or stored.get("path") != rel or not isinstance(stored.get("doc"), dict):
            return None
        doc: dict[str, Any] = stored["doc"]
        return doc

    def put(self, rel: str, kind: str, key: list[Any], doc: dict[str, Any]) -> None:
        """Best effort: a root that cannot be written has no page cache."""
        path = self._file(rel, kind)
        try:
            data = orjson.dumps({"key": key, "path": rel, "doc": doc},
                                option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS,
                                default=str)
            make_real_dirs(self.dir, 1)
            replace_from_tmp(path, lambda f: f.write(data))
        except (OSError, TypeError):
            pass
