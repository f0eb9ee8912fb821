"""The allocator tuning for bulk column work (stepscope.proc.alloc): it keeps freed blocks, so
the next array of that size faults no pages in; and only processes stepscope owns get it.

Counted in page faults (getrusage), not time: each probe runs in a fresh interpreter.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support.rundirs import run_from_columns

glibc = pytest.mark.skipif(not sys.platform.startswith("linux")
                           or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")

# Arrays of 1-32 MB (200 of them) or 40-80 MB (24: over the largest mmap threshold), three
# alive at a time: the sizes a 10-million-row table's columns and their temporaries have.
_CHURN = """
import resource, sys
import numpy as np
from stepscope.proc.alloc import tune_for_bulk
if sys.argv[1] == "tuned":
    assert tune_for_bulk() and tune_for_bulk()
# 4 KB pages in both arms (tuning turns numpy's huge-page requests off; a 2 MB page is
# one fault), so that the counts compare pages faulted in
try:
    from numpy._core.multiarray import _set_madvise_hugepage
except ImportError:
    from numpy.core.multiarray import _set_madvise_hugepage
_set_madvise_hugepage(False)
low, high, count = (5 << 20, 10 << 20, 24) if sys.argv[2] == "large" else (1 << 17, 4 << 20, 200)
sizes = np.random.default_rng(0).integers(low, high, count)
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
keep = []
for n in sizes.tolist():
    keep.append(np.ones(n))
    if len(keep) > 3:
        keep.pop(0)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""


def _python(code: str, *args: str) -> str:
    res = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


@glibc
@pytest.mark.parametrize("sizes", ["small", "large"])
def test_tuned_process_reuses_freed_blocks_instead_of_faulting_pages_again(sizes: str
                                                                           ) -> None:
    plain, tuned = (int(_python(_CHURN, how, sizes)) for how in ("plain", "tuned"))
    # measured here, in 4 KB pages: small ~302,000 plain, ~36,000 tuned (the peak's pages,
    # faulted once); large ~374,000 plain, ~90,000 tuned (no block mapped on its own)
    assert tuned * 2 < plain, (plain, tuned)


_HUGEPAGES = """
import sys
import numpy as np
try:
    from numpy._core.multiarray import _set_madvise_hugepage
except ImportError:
    from numpy.core.multiarray import _set_madvise_hugepage
if sys.argv[1] != "numpy":  # "numpy": numpy's own default, stepscope never imported
    import stepscope
    from stepscope.proc import alloc as _alloc
    from stepscope.cli import cli  # the CLI module too: importing it tunes nothing
if sys.argv[1] == "tuned":
    _alloc.tune_for_bulk()
print(_set_madvise_hugepage(True))  # the setting in force, as the switch returns it
"""


def test_a_tuned_process_asks_for_no_huge_pages_an_untuned_one_keeps_numpys_default(
        ) -> None:
    """numpy madvises arrays of 4 MB+ for huge pages, and a kernel that compacts memory
    for them on the fault made each fresh column cost several times the system time: off
    where stepscope owns the process, numpy's own default elsewhere (importing stepscope
    changes nothing)."""
    default = _python(_HUGEPAGES, "numpy")
    assert _python(_HUGEPAGES, "plain") == default
    assert _python(_HUGEPAGES, "tuned") == "False"


_WHO_TUNES = """
import sys
import click
import stepscope
from stepscope import RunDir
from stepscope.proc import alloc as _alloc
from stepscope.cli import cli
seen = [_alloc._done]
RunDir(sys.argv[1]).read_steps(cache=False, processes=2)  # workers tune, not this process
seen.append(_alloc._done)
ctx = click.Context(cli)
for name in ("run", "serve", "watch"):
    cli.get_command(ctx, name)
seen.append(_alloc._done)
cli.get_command(ctx, "report")
seen.append(_alloc._done)
print(seen)
"""


@glibc
def test_only_one_shot_commands_and_the_readers_workers_are_tuned(tmp_path: Path) -> None:
    """A training process that imports stepscope and reads its run keeps its allocator,
    as do `run`, `serve` and `watch`; `report` tunes its own process."""
    n = 50
    run_from_columns(tmp_path / "r", {"rank": np.repeat([0, 1], n),
                                      "step": np.tile(np.arange(n), 2),
                                      "step_time_s": np.full(2 * n, 0.1)})
    assert _python(_WHO_TUNES, str(tmp_path / "r")) == "[None, None, None, True]"


_WORKERS_TUNE = """
import os, sys
import stepscope.rundir.steps_table as steps_table
from stepscope import RunDir
marks = sys.argv[2]

def mark():  # stands for tune_for_bulk: records which process called it
    open(os.path.join(marks, str(os.getpid())), "w").close()
    return True

steps_table.tune_for_bulk = mark
RunDir(sys.argv[1]).read_steps(cache=False, processes=2)
print(os.getpid(), " ".join(sorted(os.listdir(marks))))
"""


def test_the_readers_worker_processes_are_the_ones_tuned(tmp_path: Path) -> None:
    """The parallel read's workers tune their allocator as they start (where the measured
    system-CPU saving is), the reading process does not."""
    n = 50
    run_from_columns(tmp_path / "r", {"rank": np.repeat([0, 1], n),
                                      "step": np.tile(np.arange(n), 2),
                                      "step_time_s": np.full(2 * n, 0.1)})
    (tmp_path / "marks").mkdir()
    parent, *workers = _python(_WORKERS_TUNE, str(tmp_path / "r"),
                               str(tmp_path / "marks")).split()
    assert workers and parent not in workers


def test_serve_watch_and_run_are_not_bulk_commands() -> None:
    from stepscope.cli import BULK_COMMANDS, COMMANDS

    assert BULK_COMMANDS <= set(COMMANDS)
    assert not BULK_COMMANDS & {"run", "serve", "watch"}
