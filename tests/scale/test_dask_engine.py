"""``--engine dask`` against a real ``distributed.LocalCluster``: same results as local.

The cluster runs in this process (``processes=False``, 2 workers of one thread) so the test
needs no ports beyond loopback and ends with the test; every wait has a timeout.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from stepscope import Recorder
from stepscope.cli import _register, cli
from stepscope.errors import ConfigError
from stepscope.proc.engine import map_items
from stepscope.rundir.index import build_index, query_index
from support.traces import cpu_step_events, thread_name, write_trace

distributed = pytest.importorskip("distributed")

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def scheduler() -> Iterator[str]:
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster:
        yield cluster.scheduler_address


def _square(x: int) -> int:
    return x * x


def test_map_items_on_the_cluster_equals_local(scheduler: str) -> None:
    items = list(range(25))
    assert map_items(_square, items, engine="dask", scheduler=scheduler) == \
        map_items(_square, items, processes=1) == [x * x for x in items]


def test_scheduler_without_dask_engine_and_bad_engine_are_user_errors() -> None:
    with pytest.raises(ConfigError, match="--engine dask"):
        map_items(_square, [1], scheduler="tcp://127.0.0.1:1")
    with pytest.raises(ConfigError, match="unknown engine"):
        map_items(_square, [1], engine="spark")


def _invoke(*args: str) -> Any:
    _register()
    res = CliRunner().invoke(cli, list(args))
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_trace_engine_dask_equals_local(tmp_path: Path, scheduler: str) -> None:
    for rank in range(4):
        events = [thread_name(2, "pt_gloo_runloop")]
        for k in range(3):
            events += cpu_step_events(offset=100.0 * k + rank, step=k + 1)
        write_trace(tmp_path / f"rank{rank}.pt.trace.json", events, rank=rank)
    local = _invoke("trace", str(tmp_path), "--json")
    dask = _invoke("trace", str(tmp_path), "--json", "--engine", "dask",
                   "--scheduler", scheduler)
    assert dask == local and sorted(local["ranks"]) == ["0", "1", "2", "3"]


def test_trace_diff_engine_dask_equals_local(tmp_path: Path, scheduler: str) -> None:
    for side, slow in (("a", 1.0), ("b", 1.5)):
        (tmp_path / side).mkdir()
        for rank in range(3):
            events = [thread_name(2, "pt_gloo_runloop")]
            for k in range(3):
                events += cpu_step_events(offset=100.0 * k * slow + rank, step=k + 1)
            write_trace(tmp_path / side / f"rank{rank}.pt.trace.json", events, rank=rank)
    args = ("trace", "diff", str(tmp_path / "a"), str(tmp_path / "b"), "--json")
    local = _invoke(*args)
    dask = _invoke(*args, "--engine", "dask", "--scheduler", scheduler)
    assert dask == local and local["a"] == str(tmp_path / "a")


def _runs(root: Path, n: int) -> None:
    for i in range(n):
        rec = Recorder(root / f"run-{i}", rank=0, background=False,
                       meta={"baseline": {"num_devices": 1 + i % 3, "seed": i}})
        for s in range(30):
            with rec.step(tokens=100 * (i + 1), samples=2) as st:
                st.log(loss=3.0 - s / 30)
        rec.close()
    (root / "broken").mkdir()
    (root / "broken" / "run.json").write_text("{ not json")


def _rows(db: Path) -> list[dict[str, Any]]:
    rows = query_index(db, sort="path")
    for r in rows:
        r.pop("indexed_utc")
    return rows


def test_index_engine_dask_equals_local(tmp_path: Path, scheduler: str) -> None:
    _runs(tmp_path / "runs", 6)
    local = build_index(tmp_path / "runs", tmp_path / "local.sqlite", processes=1)
    dask = build_index(tmp_path / "runs", tmp_path / "dask.sqlite", engine="dask",
                       scheduler=scheduler)
    assert vars(dask.stats) == vars(local.stats)
    assert dask.skipped == local.skipped and [s.path for s in local.skipped] == ["broken"]
    assert _rows(tmp_path / "dask.sqlite") == _rows(tmp_path / "local.sqlite")
    assert len(_rows(tmp_path / "local.sqlite")) == 6


class _Watching:
    """The real client, with a record of what ``gather`` brings back to this process."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.gathered: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def gather(self, futures: Any) -> Any:
        out = self._client.gather(futures)
        self.gathered.extend(out if isinstance(out, list) else [out])
        return out


def _traces(root: Path, ranks: list[int]) -> None:
    root.mkdir()
    for i, rank in enumerate(ranks):
        events = [thread_name(2, "pt_gloo_runloop")]
        for k in range(3):
            events += cpu_step_events(offset=100.0 * k + 7 * i, step=k + 1)
        write_trace(root / f"t{i}.pt.trace.json", events, rank=rank)


@pytest.mark.parametrize("case", ["plain", "steps", "same rank twice", "corrupt file"])
def test_trace_on_workers_gathers_rank_results_not_tables(tmp_path: Path, scheduler: str,
                                                          case: str) -> None:
    from stepscope.analysis.trace.breakdown import RankPart, analyze
    from stepscope.analysis.trace.distributed import analyze_on_workers
    from stepscope.schema import EventTable
    from stepscope.traces import read_trace

    _traces(tmp_path / "tr", [1, 1, 0] if case == "same rank twice" else [2, 0, 1, 3])
    if case == "corrupt file":
        (tmp_path / "tr" / "t9.pt.trace.json").write_text('{"traceEvents": [{"ph": "X",')
    steps = (2, 3) if case == "steps" else None
    local = analyze(read_trace(tmp_path / "tr", processes=1), steps=steps).to_dict()
    with distributed.Client(scheduler, timeout=30) as client:
        watch = _Watching(client)
        report = analyze_on_workers([tmp_path / "tr"], client=watch, steps=steps)
    assert report.to_dict() == local
    assert not any(isinstance(x, EventTable) for x in watch.gathered)
    assert sum(isinstance(x, RankPart) for x in watch.gathered) == len(local["ranks"])
    if case == "same rank twice":
        assert sorted(local["ranks"]) == ["0", "1", "2"]
    if case == "corrupt file":
        assert any("t9.pt.trace.json" in w for w in local["warnings"])


# Another local user's attempt: no credentials, or a certificate of its own making.
_INTRUDER = """
import sys
from distributed import Client
from distributed.security import Security
addr, how = sys.argv[1], sys.argv[2]
kw = {"security": Security.temporary()} if how == "own-cert" else {}
try:
    with Client(addr, timeout=5, **kw) as c:
        print("RAN", c.submit(sum, [1, 2]).result(timeout=10))
except Exception as exc:
    print("REFUSED", type(exc).__name__)
"""


def test_the_local_cluster_refuses_a_client_without_its_key() -> None:
    """`index --engine dask` without --scheduler: its own cluster, on loopback, with mutual
    TLS under a key made for the run; before, any local user could connect and run code."""
    import subprocess
    import sys
    from contextlib import ExitStack

    from stepscope.proc.engine import dask_client

    with ExitStack() as stack:
        client = dask_client(stack, None, 1)
        addr = client.scheduler.address
        assert client.submit(_square, 3).result(timeout=60) == 9  # its owner still can
        for target, how in [(addr, "plain"), (addr.replace("tls://", "tcp://"), "plain"),
                            (addr, "own-cert")]:
            out = subprocess.run([sys.executable, "-c", _INTRUDER, target, how],
                                 capture_output=True, text=True, timeout=60)
            assert "RAN" not in out.stdout and "REFUSED" in out.stdout, (target, how, out)
        assert addr.startswith("tls://127.0.0.1:"), addr
