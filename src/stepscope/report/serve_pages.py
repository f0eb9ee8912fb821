"""The run page's documents of finished runs, kept on disk beside the index.

A run page's first paint needs the sheet, the decimated series and (just after) the
findings: computed from the whole step table, that is the run's full read (a 1,000,000 x
8 run: ~2 GB in memory and tens of seconds). Once computed they are a few hundred KB, so
``PageCache`` writes them to ``ROOT/.stepscope-pages/`` under the run's state (``Run.key``,
the one "has it changed" key every reader uses), the query and stepscope's code. A later
server (or the same one after the run left its memory) answers from the file without
loading the table: first paint in milliseconds and memory that does not grow with the run.

Derived data only, like the index: a stale or unreadable file is a miss; a read-only root
has no page cache; runs still being written are not kept (their key changes every step).

Example::

    pages = PageCache(Path("runs"))
    doc = pages.get("exp1", "series", run.key, (2000, 600)) or build()
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from ..rundir.derived import make_real_dirs, open_derived, real_dirs, replace_from_tmp
from ..rundir.results import code_digest

__all__ = ["PageCache", "PAGES_DIR"]

PAGES_DIR = ".stepscope-pages"
_FORMAT = 3  # bump when a document changes (3: keyed by the run state)


def _key(state: str | None, query: Sequence[Any]) -> list[Any]:
    return [_FORMAT, code_digest(), state, list(query)]


class PageCache:
    """Documents by (run path, kind), each stored with its key (see the module doc)."""

    def __init__(self, root: Path) -> None:
        self.dir = root / PAGES_DIR

    def _file(self, rel: str, kind: str) -> Path:
        return self.dir / f"{hashlib.sha1(rel.encode()).hexdigest()[:20]}.{kind}.json"

    def get(self, rel: str, kind: str, state: str | None, query: Sequence[Any]
            ) -> dict[str, Any] | None:
        """The document of ``rel`` stored for this state of its files and this query."""
        if state is None or not real_dirs(self.dir, 1):  # a link there is never followed
            return None
        key = _key(state, query)
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

    def put(self, rel: str, kind: str, state: str | None, query: Sequence[Any],
            doc: dict[str, Any]) -> None:
        """Best effort: a root that cannot be written has no page cache."""
        if state is None:
            return
        key = _key(state, query)
        path = self._file(rel, kind)
        try:
            data = orjson.dumps({"key": key, "path": rel, "doc": doc},
                                option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS,
                                default=str)
            make_real_dirs(self.dir, 1)
            replace_from_tmp(path, lambda f: f.write(data))
        except (OSError, TypeError):
            pass
