"""Distributed jobs under `stepscope run`: no deadlock, no ranks mixed up.

Once, the periodic cross-rank gather (a collective keyed on each rank's
step count) deadlocked DDP with uneven inputs; processes without a RANK variable
(`torch.multiprocessing.spawn`) all wrote rank 0's file.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from support.procs import STEPSCOPE, TORCHRUN, no_traceback, run, script

pytestmark = pytest.mark.slow
# Plain torchrun runs the uneven job in 8-15 s on this machine; a hang is a timeout. The
# bound is generous (a loaded CI machine) and only ever fails on a hang.
HANG_S = 240


def _steps(path: Path) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for f in sorted((path / "steps").glob("rank-*.jsonl")):
        for line in f.read_bytes().splitlines():
            rec = orjson.loads(line)
            if "step_time_s" in rec:  # a step row (late records carry values only)
                out.setdefault(rec["rank"], []).append(rec["step"])
    return out


def test_uneven_inputs_with_join_then_barrier_finish_with_both_ranks(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run([STEPSCOPE, "run", "--out", str(out), "--cross-rank-every", "5", "--",
                TORCHRUN, "--standalone", "--nproc-per-node", "2",
                *script("torch_uneven_join.py", "--long", "45", "--short", "30")[1:]],
               timeout=HANG_S)
    no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    assert "RANK 0 TOTAL 75" in proc.stdout and "RANK 1 TOTAL 75" in proc.stdout
    steps = _steps(out)
    assert sorted(steps[0]) == list(range(45)) and sorted(steps[1]) == list(range(30))
    meta = orjson.loads((out / "run.json").read_bytes())
    assert meta["status"] == "finished"


def test_mp_spawn_ddp_gives_one_file_per_rank_without_duplicates(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run([STEPSCOPE, "run", "--out", str(out), "--",
                *script("torch_mp_spawn.py", "--world", "2", "--steps", "12")], timeout=HANG_S)
    no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    files = sorted(p.name for p in (out / "steps").glob("rank-*.jsonl"))
    assert len(files) == 2, files
    steps = _steps(out)
    assert {r: sorted(s) for r, s in steps.items()} == {0: list(range(12)),
                                                        1: list(range(12))}
