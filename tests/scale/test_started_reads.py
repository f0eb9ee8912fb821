"""A read started in worker processes while the caller works (``StepRead``), and the
comparison that uses it: run A's share of the speed ledger computed while run B decodes.

Oracles: the serial read without cache (the table, its NaN flags and the stats), and the
comparison computed the plain way, with no share prepared: equal, bit for bit.
"""

from __future__ import annotations

import multiprocessing as mp
import shutil
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
from click.testing import CliRunner

import stepscope.rundir.steps_table as steps_table
from stepscope import RunDir, RunMeta
from stepscope.analysis.compare import speed
from stepscope.analysis.compare.runs import compare_runs
from stepscope.cli import cli
from stepscope.errors import StepscopeError
from stepscope.proc import forked as _forked
from stepscope.rundir import run as run_mod
from stepscope.rundir.run import Run
from support.old_step_reader import assert_tables_equal
from support.rundirs import run_from_columns

_RANKS, _STEPS = 6, 400


def _columns(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    rank = np.repeat(np.arange(_RANKS), _STEPS)
    step = np.tile(np.arange(_STEPS), _RANKS)
    st = 1.0 + rng.normal(0, 0.02, rank.size) + 0.15 * (rank == 3)
    st[step == 0] *= 3
    loss = 3.0 / (1 + step / 100) + rng.normal(0, 0.01, rank.size)
    loss[rng.choice(rank.size, 5, replace=False)] = np.nan  # explicit "NaN" values
    return {"rank": rank, "step": step, "step_time_s": st, "data_wait_s": 0.03 * st,
            "comm_exposed_s": 0.05 * st, "tokens": np.full(rank.size, 4096.0),
            "samples": np.full(rank.size, 8.0), "loss": loss,
            "mem_peak_bytes": np.full(rank.size, 2e9)}


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a", tmp_path / "b"
    for path, seed in ((a, 1), (b, 2)):
        run_from_columns(path, _columns(seed), RunMeta(run_id=path.name, status="finished",
                                                       baseline={"num_devices": _RANKS}))
    with open(b / "steps" / "rank-00002.jsonl", "ab") as f:
        f.write(b'{"rank": 2, "step": 9999, "step_time_s": 1.0, "tok')  # a torn last line
    return a, b


def _manifests(run: RunDir) -> list[Path]:
    return sorted((run.cache_dir / "steps").glob("rank-*.jsonl.json"))


def test_a_started_read_decodes_while_the_caller_works(runs: tuple[Path, Path]) -> None:
    """The workers fill the cache before ``result()`` is called (the caller only waited
    for them), and the table is the serial uncached read's."""
    run = RunDir(runs[1])
    with run.start_read_steps(processes=2) as pending:
        assert mp.active_children()  # the workers were started with the read
        deadline = time.monotonic() + 60
        while len(_manifests(run)) < _RANKS and time.monotonic() < deadline:
            time.sleep(0.01)  # this process works on something else meanwhile
        assert len(_manifests(run)) == _RANKS
        table, stats = pending.result()
        assert not mp.active_children()  # result() ended them
    cold, cold_stats = run.read_steps(cache=False, processes=1)
    assert_tables_equal(table, cold)
    assert stats.to_dict() == cold_stats.to_dict() and stats.torn_tail == 1


def test_a_started_read_left_unread_ends_its_workers(runs: tuple[Path, Path]) -> None:
    run = RunDir(runs[0])
    with pytest.raises(RuntimeError, match="the caller failed"):
        with run.start_read_steps(processes=2):
            assert mp.active_children()
            raise RuntimeError("the caller failed")
    assert not mp.active_children()
    pending = run.start_read_steps(processes=2)
    pending.close()
    pending.close()  # idempotent
    assert not mp.active_children()
    assert_tables_equal(run.read_steps()[0], run.read_steps(cache=False)[0])


def test_a_started_read_of_a_cached_run_starts_no_worker(runs: tuple[Path, Path]) -> None:
    run = RunDir(runs[0])
    first, _ = run.read_steps(processes=2)
    with run.start_read_steps(processes=2) as pending:
        assert not mp.active_children()
        assert_tables_equal(pending.result()[0], first)


def test_a_run_says_bad_input_at_open_and_no_records_when_its_read_ends(
        tmp_path: Path) -> None:
    with pytest.raises(StepscopeError, match="no-such-run"):
        Run.open(tmp_path / "no-such-run")
    run_from_columns(tmp_path / "empty", {"rank": [0], "step": [0], "step_time_s": [1.0]})
    (tmp_path / "empty" / "steps" / "rank-00000.jsonl").write_bytes(b"")
    with Run.open(tmp_path / "empty").start_read() as pending, \
            pytest.raises(StepscopeError, match="no step records"):
        pending.read()


def test_a_prepared_share_is_reused_and_changes_nothing(runs: tuple[Path, Path],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (ta, _), (tb, _) = RunDir(runs[0]).read_steps(), RunDir(runs[1]).read_steps()
    ma, mb = RunDir(runs[0]).read_meta(), RunDir(runs[1]).read_meta()
    plain = compare_runs(ta, ma, tb, mb, seed=3).to_dict()
    samples: list[object] = []
    real = speed.step_sample
    monkeypatch.setattr(speed, "step_sample", lambda t, *a: samples.append(t) or real(t, *a))
    with speed.kept_run_speeds():
        speed.prepare_speed(ta, ma, seed=3)
        assert samples == [ta]
        kept = compare_runs(ta, ma, tb, mb, seed=3).to_dict()
        assert samples == [ta, tb]  # A's share was not computed again
        compare_runs(ta, ma, tb, mb, seed=3)  # taken once: not held for another ledger
        assert samples == [ta, tb, ta, tb]
    assert orjson.dumps(kept) == orjson.dumps(plain)
    with speed.kept_run_speeds():  # another seed, or other objects: another share
        speed.prepare_speed(ta, ma, seed=4)
        speed.prepare_speed(ta, RunDir(runs[0]).read_meta(), seed=3)
        compare_runs(ta, ma, tb, mb, seed=3)
    assert samples[4:] == [ta, ta, ta, tb]
    speed.prepare_speed(ta, ma, seed=3)  # outside the block: nothing is done
    compare_runs(ta, ma, tb, mb, seed=3)
    assert samples[8:] == [ta, tb]


def test_cli_compare_with_a_started_read_equals_the_plain_comparison(
        runs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Run B is read by worker processes (the size threshold lowered for these small
    files) while A's share is computed: the --json document is the plain comparison's."""
    a, b = runs
    monkeypatch.setattr(steps_table, "_PARALLEL_MIN_BYTES", 1)
    monkeypatch.setattr(_forked, "MIN_ROWS", 0)  # these runs are small: prepared anyway
    samples: list[int] = []
    real = speed.step_sample
    monkeypatch.setattr(speed, "step_sample", lambda t, *a: samples.append(len(t)) or real(t, *a))
    prepared: list[int] = []
    real_prepare = run_mod.prepare_speed
    monkeypatch.setattr(run_mod, "prepare_speed",
                        lambda t, *a, **k: prepared.append(len(t)) or real_prepare(t, *a, **k))
    res = CliRunner().invoke(cli, ["compare", str(a), str(b), "--json", "--allow-multi",
                                   "--seed", "5"])
    assert res.exit_code == 0, res.output
    assert len(prepared) == 1 and len(samples) == 2  # A's prepared share was reused
    assert list(_manifests(RunDir(b)))  # B was read through the cache by the workers
    ra, rb = RunDir(a), RunDir(b)
    plain = compare_runs(ra.read_steps(cache=False)[0], ra.read_meta(),
                         rb.read_steps(cache=False)[0], rb.read_meta(), seed=5,
                         conditions=(ra.read_conditions(), rb.read_conditions()))
    assert orjson.loads(res.stdout_bytes) == orjson.loads(orjson.dumps(
        plain.to_dict(), option=orjson.OPT_SERIALIZE_NUMPY, default=str))
    # Past MAX_ROWS, A's share is computed in the ledger, after B's read: the same answer.
    monkeypatch.setattr(_forked, "MAX_ROWS", 10)
    for run in (a, b):
        shutil.rmtree(run / ".cache")
    again = CliRunner().invoke(cli, ["compare", str(a), str(b), "--json", "--allow-multi",
                                     "--seed", "5"])
    assert again.exit_code == 0, again.output
    assert len(prepared) == 1 and len(samples) == 6  # 2 more for `plain` above
    assert again.stdout_bytes == res.stdout_bytes
