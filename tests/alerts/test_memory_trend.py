"""Memory creep as a trend (the health rules' one definition, live): a steady leak fires
once with its rate, a step up, noise and a flat high-water mark do not; a real leaking
PyTorch run fires, the same run without the leak does not."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stepscope.alerts.config import RulesConfig
from stepscope.alerts.rules import LiveRules
from stepscope.analysis.health.config import HealthConfig
from stepscope.analysis.health.stats import spearman, theil_sen_slope
from stepscope.analysis.health.system import memory_creep
from stepscope.rundir.store import RunDir

SCRIPTS = Path(__file__).resolve().parent / "scripts"
MiB = float(2**20)
GiB = float(2**30)


def _fired(mem: list[float]) -> list[tuple[str, int | None, dict[str, float]]]:
    rules = LiveRules(RulesConfig(), "exp", 0)  # warm-up: the first 5 steps
    out = []
    for step, m in enumerate(mem):
        rec: dict[str, Any] = {"rank": 0, "step": step, "step_time_s": 0.1,
                               "mem_peak_bytes": m}
        out.extend((a.rule, a.step, dict(a.values)) for a in rules.observe(rec, 0.0))
    return out


def test_trend_statistics_on_hand_computed_series() -> None:
    # Ties at their average rank: a flat high-water mark has no trend (not rank order 1.0).
    assert spearman(np.arange(5.0), np.ones(5)) == 0.0
    assert spearman(np.arange(6.0), np.array([1.0, 1, 1, 2, 2, 2])) == pytest.approx(
        (13.5 / 17.5) ** 0.5)
    # Theil-Sen: the median pairwise slope ignores the one outlier (pairs with it: 25, 33,
    # 49, 97; the other six pairs: 1).
    assert theil_sen_slope(np.arange(5.0), np.array([0.0, 1, 2, 3, 100])) == 1.0


def test_a_steady_leak_fires_once_with_its_rate() -> None:
    # +4 MiB a step from 1 GiB. Judged every 10 steady steps from 40 on: steps 5-44, first
    # quarter (5-14) median 1 GiB + 38 MiB, last (35-44) 1 GiB + 158 MiB.
    got = _fired([GiB + 4 * MiB * i for i in range(200)])
    assert [(rule, step) for rule, step, _ in got] == [("memory_creep", 44)]
    values = got[0][2]
    assert values["first_mem_peak_bytes"] == GiB + 38 * MiB
    assert values["mem_peak_bytes"] == GiB + 158 * MiB
    assert values["bytes_per_step"] == 4 * MiB and values["rank_correlation"] == 1.0


def test_a_slow_leak_is_found_over_the_whole_history() -> None:
    # +0.3 MiB a step: the latest 200 steps grow 45 MiB between quarters, under 5% of
    # ~1 GiB; the history from step 5 first passes it at 230 points (quarters of 57:
    # 173 x 0.3 = 51.9 MiB >= 5% of 1 GiB + 8.4 MiB = 51.6 MiB), i.e. at step 234.
    got = _fired([GiB + 0.3 * MiB * i for i in range(400)])
    assert [(rule, step) for rule, step, _ in got] == [("memory_creep", 234)]
    assert got[0][2]["first_mem_peak_bytes"] == GiB + 0.3 * MiB * 33


def test_a_step_up_noise_and_a_plateau_are_not_creep() -> None:
    step_up = [GiB if i < 60 else 1.5 * GiB for i in range(300)]  # a cache filled once
    rnd = random.Random(0)
    noise = [GiB + 64 * MiB * rnd.random() for _ in range(300)]
    plateau = [GiB + 100 * MiB * min(i, 20) for i in range(300)]  # grows, then stops
    for series in (step_up, noise, plateau):
        assert _fired(series) == []
    # The offline rule judges with the same function: a step up is a level change.
    assert memory_creep(np.arange(300.0), np.array(step_up), HealthConfig()) is None


def _run(tmp_path: Path, name: str, *script_args: str) -> list[dict[str, Any]]:
    alerts = tmp_path / "alerts.toml"
    alerts.write_text("[rules]\nstall_after_s = 600\n")  # console only: no sink to reach
    out = tmp_path / name
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE_")}
    # glibc's mmap threshold is dynamic: after the first 4 MiB block is freed, later ones
    # come from a heap arena, and when the main thread meets a busy arena (the session's
    # writer thread, on a loaded host) the freed block is not reused: the clean run's RSS
    # high-water mark then climbs ~4 MiB a step for ~30 steps (388 to 436 MiB in one CI
    # run) before it levels off, which no 40-step window can tell from a leak. A fixed
    # threshold maps each 4 MiB block and unmaps it when freed, in both runs.
    env["MALLOC_MMAP_THRESHOLD_"] = str(1 << 20)
    proc = subprocess.run([sys.executable, "-m", "stepscope", "run", "--alerts", str(alerts),
                           "--out", str(out), "--", sys.executable,
                           str(SCRIPTS / "leak_memory.py"), *script_args],
                          capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr
    events, _ = RunDir.open(out).read_events(type="alert")
    return events


@pytest.mark.slow
def test_a_real_leaking_run_fires_and_the_same_run_without_the_leak_does_not(
        tmp_path: Path) -> None:
    leak = [a for a in _run(tmp_path, "leak", "--leak") if a["rule"] == "memory_creep"]
    assert len(leak) == 1
    # 4 MiB kept per step; the RSS high-water mark also counts Python and torch's
    # own allocations, so the rate is about that, not exactly.
    assert 3 * MiB <= leak[0]["values"]["bytes_per_step"] <= 5 * MiB
    assert leak[0]["values"]["rank_correlation"] >= 0.9
    assert leak[0]["step"] <= 5 + 40 + 10  # warm-up, one window, one judgement period
    clean = _run(tmp_path, "clean")
    assert [a for a in clean if a["rule"] == "memory_creep"] == []
