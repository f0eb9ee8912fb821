"""Run directories written from plain columns, as a recorder would have left them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from stepscope import RunDir, RunMeta


def run_from_columns(path: Path, columns: Mapping[str, Sequence[Any] | np.ndarray],
                     meta: RunMeta | None = None) -> RunDir:
    """One ``steps/rank-N.jsonl`` per rank of ``columns`` (which must hold ``rank`` and
    ``step``), one JSON object per row; NaN values are left out of the record."""
    run = RunDir.create(path, meta or RunMeta(run_id=path.name, status="finished"))
    cols = {k: np.asarray(v) for k, v in columns.items()}
    ranks = cols["rank"]
    for r in np.unique(ranks).tolist():
        rows = np.flatnonzero(ranks == r)
        with open(run.steps_path(int(r)), "wb") as fh:
            for i in rows.tolist():
                rec = {k: v[i].item() for k, v in cols.items()
                       if not (v.dtype.kind == "f" and np.isnan(v[i]))}
                fh.write(orjson.dumps(rec) + b"\n")
    return run
