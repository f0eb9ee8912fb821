"""DDP under `stepscope run -- torchrun` (2 ranks, gloo, CPU) and the comm-timing math."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from stepscope.integrations.torch.ddp import (
    CommTimer,
    cross_rank_summary,
    exposed_after,
    summarize_comm,
    union_s,
    wait_transfer,
)
from stepscope.rundir.store import RunDir
from support.torch_run import SCRIPTS, assert_times_agree, printed_times, stepscope_run

TORCHRUN = str(Path(sys.executable).parent / "torchrun")


def _torchrun(*script_args: str) -> tuple[str, ...]:
    return (TORCHRUN, "--standalone", "--nproc_per_node", "2",
            str(SCRIPTS / "torch_ddp.py"), *script_args)


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")
def test_torchrun_ddp_per_rank_tables(tmp_path):
    out = tmp_path / "ddp"
    proc = stepscope_run(out, *_torchrun("--steps", "12"),
                         args=("--cross-rank-every", "5"), timeout=180)
    assert proc.returncode == 0, proc.stderr
    run = RunDir(out)
    table, stats = run.read_steps()
    assert stats.skipped == 0
    assert table.ranks() == [0, 1]
    for rank in (0, 1):
        t = table.rank(rank)
        assert t["step"].tolist() == list(range(12))
        assert_times_agree(t["step_time_s"], t["step"], printed_times(proc.stdout, rank))
        for col in ("data_wait_s", "forward_s", "backward_s", "optimizer_s", "comm_s",
                    "comm_exposed_s", "loss", "lr", "grad_norm"):
            assert np.isfinite(t[col]).all(), (rank, col)
        assert (t["comm_s"] > 0).all()
        assert (t["comm_exposed_s"] <= t["comm_s"] + 1e-9).all()
        assert t["tokens"].tolist() == [16 * 64.0] * 12  # per rank: 16 samples x 64 tokens
        # bucket_cap_mb=0.25 splits the 2.4 MB of gradients into several buckets
        assert (t["comm_buckets"][1:] >= 2).all()
        # each rank logs its score from the latest published view: the first exchange's
        # view is merged while training goes on, so it shows at the second (step 9)
        assert np.isfinite(t["straggler_score"][9])
    # DDP averages gradients: both ranks see the same global gradient norm
    assert np.allclose(table.rank(0)["grad_norm"], table.rank(1)["grad_norm"], rtol=1e-5)
    meta = run.read_meta()
    assert meta.status == "finished"
    b = meta.baseline
    assert b["num_devices"] == 2 and b["dp"] == 2 and b["parallel_strategy"] == "ddp"
    assert b["global_batch"] == 32 and b["seed"] == 42
    events, _ = run.read_events(type="cross_rank")
    assert [e["step"] for e in events] == [4, 9]
    for e in events:
        assert set(e["straggler_scores"]) == {"0", "1"}
        assert set(e["comm_wait_s"]) == {"0", "1"}
        assert all(v >= 0.0 for v in e["comm_wait_s"].values())
        assert all(v > 0.0 for v in e["comm_transfer_s"].values())
        assert "same host" in e["comm_split"]


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")
def test_noop_grad_sync(tmp_path):
    out = tmp_path / "noop"
    proc = stepscope_run(out, *_torchrun("--steps", "4"),
                         env={"STEPSCOPE_NOOP_GRAD_SYNC": "1"}, timeout=180)
    assert proc.returncode == 0, proc.stderr
    run = RunDir(out)
    table, _ = run.read_steps()
    assert table.ranks() == [0, 1] and len(table) == 8
    assert not table.has_data("comm_buckets")  # nothing was sent
    # each rank kept its own gradients: the norms differ between ranks
    assert not np.allclose(table.rank(0)["grad_norm"], table.rank(1)["grad_norm"])
    meta = run.read_meta()
    assert meta.config["valid_training_run"] is False
    assert "NOOP_GRAD_SYNC" in meta.config["modified_by"]


def test_union_and_exposed():
    assert union_s([]) == 0.0
    assert union_s([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]) == 4.0
    assert union_s([(1.0, 2.0), (0.0, 5.0)]) == 5.0
    assert exposed_after([(0.0, 2.0), (1.5, 4.0)], compute_end=3.0) == 1.0
    assert exposed_after([(0.0, 2.0)], compute_end=3.0) == 0.0


def test_wait_transfer_by_hand():
    wait, transfer = wait_transfer([[0.0, 10.0], [1.0, 10.5]], [[2.0, 11.0], [2.0, 11.0]])
    assert wait == [1.5, 0.0] and transfer == [1.5, 1.5]


def test_summarize_comm_buckets_and_blocking_collectives():
    now = iter([0.0, 0.0])
    timer = CommTimer(clock=lambda: next(now), wall=lambda: 100.0)
    # host marks given directly: bucket 0 [1, 2], bucket 1 [3, 5] (last launch = 3),
    # a blocking all-gather [6, 6.5]
    from stepscope.integrations.torch.ddp import _Interval

    items = [_Interval("allreduce", 1.0, 2.0, bucket=0, start_wall=1.0, end_wall=2.0),
             _Interval("allreduce", 3.0, 5.0, bucket=1, start_wall=3.0, end_wall=5.0),
             _Interval("allgather", 6.0, 6.5, blocking=True)]
    step = summarize_comm(items, compute_end=3.0)
    assert step.total_s == 3.5
    assert step.exposed_s == 2.0 + 0.5
    assert step.exposed_by_phase == {"other": 0.5, "backward": 2.0}
    assert step.by_kind_s == {"allreduce": 3.0, "allgather": 0.5}
    assert (step.buckets, step.overlapped_buckets) == (2, 1)
    assert step.bucket_launch_wall == [1.0, 3.0] and step.bucket_done_wall == [2.0, 5.0]
    assert timer.take() == []


def test_cross_rank_summary_scores_and_split():
    from stepscope.integrations.torch.ddp import CROSS_FIELDS, MAX_BUCKETS

    def row(compute, launch, done, host=1.0):
        pad = [math.nan] * MAX_BUCKETS
        med = [0.0] * len(CROSS_FIELDS)
        med[CROSS_FIELDS.index("compute_s")] = compute
        return med + (launch + pad)[:MAX_BUCKETS] + (done + pad)[:MAX_BUCKETS] + [host]

    ev = cross_rank_summary(7, [row(1.0, [0.0], [2.0]), row(2.0, [1.0], [2.0])])
    assert ev["type"] == "cross_rank" and ev["step"] == 7
    assert ev["comm_wait_s"] == {"0": 1.0, "1": 0.0}
    assert ev["comm_transfer_s"] == {"0": 1.0, "1": 1.0}
    other = cross_rank_summary(7, [row(1.0, [0.0], [2.0], 1.0), row(2.0, [1.0], [2.0], 2.0)])
    assert "comm_wait_s" not in other and other["comm_split"].startswith("not separated")


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")
def test_torchrun_fsdp2_collectives_timed(tmp_path):
    out = tmp_path / "fsdp"
    script = str(SCRIPTS / "torch_fsdp2.py")
    proc = stepscope_run(out, TORCHRUN, "--standalone", "--nproc_per_node", "2", script,
                         timeout=180)
    assert proc.returncode == 0, proc.stderr
    table, _ = RunDir(out).read_steps()
    assert table.ranks() == [0, 1] and len(table) == 12
    # on gloo FSDP2's all-gathers and reduce-scatters block: all of it is exposed, and it
    # is taken out of the forward/backward phases it interrupted
    for col in ("comm_allgather_s", "comm_reducescatter_s", "comm_s", "forward_s",
                "backward_s"):
        assert (table[col] > 0).all(), col
    assert np.allclose(table["comm_exposed_s"], table["comm_s"])
    phases = table["forward_s"] + table["backward_s"] + table["optimizer_s"] \
        + table["comm_exposed_s"]
    assert (phases <= table["step_time_s"] * 1.0001).all()
    meta = RunDir(out).read_meta()
    assert meta.baseline["parallel_strategy"] == "fsdp"
    # FSDP2's forward hooks keep its unshard state: stepscope does not run the model to
    # count its FLOPs (doing so broke the script's next forward), and says why
    assert "forward hooks of its own" in meta.config["flops_counted"]


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")
def test_rank_crash_names_the_first_failure(tmp_path):
    out = tmp_path / "crash"
    proc = stepscope_run(out, *_torchrun("--steps", "8", "--crash-rank", "1",
                                         "--crash-step", "3"), timeout=180)
    assert proc.returncode != 0
    table, _ = RunDir(out).read_steps()
    for rank in (0, 1):  # each rank's records up to the crash are kept
        assert table.rank(rank)["step"].tolist() == [0, 1, 2]
    meta = RunDir(out).read_meta()
    assert meta.status == "failed"
    # rank 0 failed second (its peer went away); run.json names rank 1's exception
    assert meta.error.startswith("ValueError: bad sample on rank 1 (rank 1, step 3)")
