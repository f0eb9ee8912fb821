"""``STEPSCOPE_REPLAY_DATA=1``: DataLoaders replay their first K real batches from memory.

The isolation experiment of the field report (synthetic-data substitution, with real
shapes): the first K batches each DataLoader produces are kept; after that every
``next()`` returns one of them in turn without touching the dataset, workers or collate
function, so the data pipeline's cost drops to ~0 while the model sees identical shapes.
An epoch still ends after ``len(loader)`` batches (when the loader has a length).
"""

from __future__ import annotations

from typing import Any


class Replay:
    """Per-loader cache of the first ``k`` batches.

    Keyed by the dataset and the batch sampler (both live as long as the DataLoader), so
    a new epoch's iterator finds its loader's batches, and a second loader over the same
    dataset (e.g. evaluation, another batch size) keeps its own.
    """

    def __init__(self, k: int) -> None:
        self.k = max(1, int(k))
        self._cache: dict[tuple[int, int], list[Any]] = {}
        self._pos: dict[tuple[int, int], int] = {}

    def take(self, it: Any) -> tuple[bool, Any]:
        """(True, batch) to replay; (False, None) while the first ``k`` are still real.

        Raises StopIteration when a replayed epoch has reached ``len(loader)`` batches.
        """
        key = self._key(it)
        cached = self._cache.setdefault(key, [])
        if len(cached) < self.k:
            return False, None
        try:
            length: int | None = len(it)
        except TypeError:  # IterableDataset without a length: replay forever
            length = None
        done = getattr(it, "_num_yielded", 0)
        if length is not None and done >= length:
            raise StopIteration
        pos = self._pos.get(key, 0)
        self._pos[key] = pos + 1
        if hasattr(it, "_num_yielded"):
            it._num_yielded = done + 1
        return True, cached[pos % self.k]

    def keep(self, it: Any, batch: Any) -> None:
        """Remember a real batch (the loader's own ``next`` produced it)."""
        cached = self._cache.setdefault(self._key(it), [])
        if len(cached) < self.k:
            cached.append(batch)

    @staticmethod
    def _key(it: Any) -> tuple[int, int]:
        return id(getattr(it, "_dataset", it)), id(getattr(it, "_index_sampler", None))
