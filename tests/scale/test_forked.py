"""A computation in a forked child (``proc.forked.Forked``), and the report that uses it: the
child's result when it has one, else the same computed in this process, whatever the
child did (raised, died, hung, sent what does not pickle); never a child left behind.

Real processes throughout: each function below tells where it ran by its process id.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from click.testing import CliRunner

from stepscope import RunMeta
from stepscope.cli import cli
from stepscope.proc import forked as _forked
from stepscope.proc.forked import Forked
from stepscope.report.offline import write_html
from stepscope.rundir.run import Run
from support.rundirs import run_from_columns

_PARENT = os.getpid()


def _where(x: int) -> tuple[int, int]:
    return os.getpid(), x * 2


def _fails_in_child() -> int:
    if os.getpid() != _PARENT:
        raise ValueError("only in the child")
    return os.getpid()


def _dies_in_child() -> int:
    if os.getpid() != _PARENT:
        os.kill(os.getpid(), signal.SIGKILL)
    return os.getpid()


def _hangs_in_child() -> int:
    if os.getpid() != _PARENT:
        time.sleep(600)
    return os.getpid()


def _unpicklable() -> Any:
    pid = os.getpid()
    return lambda: pid


def _raises() -> None:
    raise KeyError("the real error")


def test_the_result_comes_from_the_child() -> None:
    job = Forked(_where, 21)
    assert job.forked
    pid, value = job.result()
    assert value == 42 and pid != os.getpid()
    assert not mp.active_children()


@pytest.mark.parametrize("fn", [_fails_in_child, _dies_in_child, _unpicklable])
def test_a_child_without_a_result_is_replaced_by_this_process(fn: Any) -> None:
    got = Forked(fn).result()
    assert (got() if callable(got) else got) == os.getpid()
    assert not mp.active_children()


def test_a_hung_child_is_killed_after_its_patience() -> None:
    job = Forked(_hangs_in_child, patience=0.5)
    assert job.result() == os.getpid()  # computed here: the child (600 s asleep) was not
    assert not mp.active_children()     # waited for, and is gone


def test_an_error_is_raised_here_by_the_same_code() -> None:
    with pytest.raises(KeyError, match="the real error"):
        Forked(_raises).result()


def test_a_fork_refused_computes_it_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """No process to be had (EAGAIN: a limit on processes, no memory for the page tables).
    Simulated: these tests may run as root, whom RLIMIT_NPROC does not bind."""
    def refused(self: Any) -> None:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(type(mp.get_context("fork").Process()), "start", refused)
    job = Forked(_where, 4)
    assert not job.forked and job.result() == (os.getpid(), 8)


def test_no_fork_and_closing_without_a_result() -> None:
    job = Forked(_where, 1, fork=False)
    assert not job.forked and job.result() == (os.getpid(), 2)
    with Forked(_hangs_in_child):
        assert mp.active_children()
    assert not mp.active_children()


_ORPHAN = """
import os, sys, time
sys.path[:0] = sys.argv[1:2]
from stepscope.proc import forked as _forked
from stepscope.proc.forked import Forked
from stepscope.report.offline import write_html
from stepscope.rundir.run import Run
job = Forked(time.sleep, 600)
print(job._proc.pid, flush=True)
os._exit(0)  # dies without asking for the result: no cleanup runs
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")  # a zombie no one reaped yet is dead


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_the_child_dies_with_its_parent() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _ORPHAN,
                             str(Path(_forked.__file__).parents[2])],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        proc.wait(timeout=60)
    finally:
        proc.kill()
        if proc.stdout is not None:
            proc.stdout.close()
    deadline = time.monotonic() + 30
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(child):
        os.kill(child, signal.SIGKILL)
        pytest.fail("the child outlived its parent")


def test_report_findings_from_the_child_equal_those_computed_here(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    ranks, steps = 4, 300
    rank, step = np.repeat(np.arange(ranks), steps), np.tile(np.arange(steps), ranks)
    st = 1.0 + rng.normal(0, 0.01, rank.size) + 0.3 * (rank == 2)  # a straggler
    st[step == 0] *= 3
    cols = {"rank": rank, "step": step, "step_time_s": st, "data_wait_s": 0.3 * st,
            "tokens": np.full(rank.size, 4096.0), "loss": 3.0 - step / 1000,
            "mem_peak_bytes": 1e9 + 1e6 * step}  # a memory creep
    run_from_columns(tmp_path / "r", cols, RunMeta(run_id="r", status="finished"))
    used: list[bool] = []  # each child's result taken: whether it came from a child

    class Watched(Forked):  # type: ignore[type-arg]
        def result(self) -> Any:
            used.append(self.forked)
            return super().result()

    monkeypatch.setattr(_forked, "Forked", Watched)
    made: list[bool] = []  # whether the page's charts were made beside the sheet
    real_analyse = Run.analyse

    def analyse(self: Run, **k: Any) -> None:
        real_analyse(self, **k)
        made.append(bool(self._series))

    monkeypatch.setattr(Run, "analyse", analyse)
    monkeypatch.setattr(_forked, "MIN_ROWS", 0)  # this run is small: a child anyway
    res = CliRunner().invoke(cli, ["report", str(tmp_path / "r"), "--json", "--html",
                                   str(tmp_path / "forked.html")])
    assert res.exit_code == 0, res.output
    assert used == [True] and made == [True]
    shutil.rmtree(tmp_path / "r" / ".cache")  # not the stored findings: computed again
    here = Run.open(tmp_path / "r")  # fork=False: the rules in this process, no child
    found = here.findings()
    assert used == [True]
    doc = orjson.loads(res.stdout_bytes)
    assert doc["findings"] == orjson.loads(orjson.dumps(
        [f.to_dict() for f in found], option=orjson.OPT_SERIALIZE_NUMPY, default=str))
    assert {f.category for f in found} >= {"data_pipeline", "memory"}
    # the page's charts, made beside the sheet while the child finished: the same page
    page = write_html(here, tmp_path / "here.html").read_bytes()
    assert page == (tmp_path / "forked.html").read_bytes()
    monkeypatch.setattr(_forked, "MIN_ROWS", 10**6)
    shutil.rmtree(tmp_path / "r" / ".cache")
    small = Run.open(tmp_path / "r", fork=True)  # too few rows to pay for a child
    small.analyse()
    assert used == [True]
    assert [f.to_dict() for f in small.findings()] == [f.to_dict() for f in found]
