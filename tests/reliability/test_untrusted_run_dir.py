"""Reading a run never deletes or writes outside it, whatever links its derived state holds.

A run directory received as a tarball, or in a group-writable shared runs folder, can hold
a symbolic link where a reader keeps derived data. Before: a link at
``RUN/.cache/steps/rank-00000.jsonl.d`` had ``report``, ``index`` and the dashboard prune
every file of the directory it pointed to, and a linked ``RUN/.cache`` had every reader
write into its target. Each test plants one link to a directory of canary files (named
like the files the readers write and remove: segments, manifests, temporary files of a
dead process), runs the readers, and checks the canaries byte for byte.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from stepscope.report.serve_data import Dashboard
from stepscope.report.serve_pages import PAGES_DIR
from support.procs import no_traceback, stepscope
from support.rundirs import run_from_columns

pytestmark = pytest.mark.slow

# Names a careless reader would remove or overwrite: a segment, a manifest, a temporary
# file of a process that no longer exists (pid above Linux's largest), a summary entry.
CANARIES = {
    "keep.txt": b"not yours\n",
    "0123456789ab.npy": b"a segment-like name\n",
    "rank-00000.jsonl.json": b"{}\n",
    ".rank-00000.jsonl.json.9999999.tmp": b"a stale-temp-like name\n",
    "report-0123456789ab.json": b"{}\n",
}
LINKED = [".cache", ".cache/steps", ".cache/steps/rank-00000.jsonl.d", ".cache/summary",
          ".cache/steps/rank-00000.jsonl.json"]


def _tree(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def _root_with_link(tmp_path: Path, where: str) -> tuple[Path, Path, Path]:
    """(runs root, the run, the canary directory) with a link at RUN/``where``."""
    target = tmp_path / "victim"
    target.mkdir()
    for name, data in CANARIES.items():
        (target / name).write_bytes(data)
    root = tmp_path / "runs"
    n = 300
    run = run_from_columns(root / "exp", {
        "rank": np.repeat([0, 1], n), "step": np.tile(np.arange(n), 2),
        "step_time_s": np.full(2 * n, 0.25), "loss": np.linspace(3.0, 1.0, 2 * n)}).path
    link = run / where
    link.parent.mkdir(parents=True, exist_ok=True)
    # The manifest's link points at a file; every other at the directory.
    link.symlink_to(target / "rank-00000.jsonl.json" if where.endswith(".json") else target)
    return root, run, target


def _read_everything(root: Path, run: Path) -> None:
    """report, index and the dashboard's reads of the run, twice (cold, then warm)."""
    for _ in range(2):
        rep = stepscope("report", str(run))
        assert rep.returncode == 0, rep.stderr
        no_traceback(rep)
        idx = stepscope("index", str(root))
        assert idx.returncode == 0, idx.stderr
        no_traceback(idx)
        board = Dashboard(root, refresh_s=0.0, index_wait_s=5.0)
        doc = board.run("exp")
        assert doc["sheet"], doc
        assert board.series("exp")["series"]["result/loss"]["steps"]


@pytest.mark.parametrize("where", LINKED)
def test_a_linked_derived_path_is_never_followed(tmp_path: Path, where: str) -> None:
    root, run, target = _root_with_link(tmp_path, where)
    before = _tree(target)
    _read_everything(root, run)
    assert _tree(target) == before  # nothing deleted, nothing written, nothing changed
    assert os.path.islink(run / where) or where.endswith(".json")  # the link is left


def test_a_linked_page_cache_of_the_root_is_never_followed(tmp_path: Path) -> None:
    root, run, target = _root_with_link(tmp_path, ".cache/steps")
    (root / PAGES_DIR).symlink_to(target)
    before = _tree(target)
    _read_everything(root, run)
    assert _tree(target) == before


def test_an_unlinked_cache_is_still_kept_and_used(tmp_path: Path) -> None:
    """The rule costs nothing for an ordinary run: the cache is written as before."""
    root = tmp_path / "runs"
    run = run_from_columns(root / "exp", {"rank": [0, 0], "step": [0, 1],
                                           "step_time_s": [0.5, 0.5]}).path
    rep = stepscope("report", str(run))
    assert rep.returncode == 0, rep.stderr
    assert sorted(p.name for p in (run / ".cache" / "steps" / "rank-00000.jsonl.d").iterdir())
    assert list((run / ".cache" / "summary").iterdir())
