"""The environment rules live (the offline regimes' rules): contention and throttling fire with
the numbers that show them; slow steps the host does not explain, a busy host that costs
nothing and a noisy healthy run fire nothing. A real CPU hog beside a real run fires
"the host is contended"."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from stepscope.alerts.config import RulesConfig
from stepscope.alerts.rules import LiveRules
from stepscope.rundir.store import RunDir
from support.procs import cpu_hogs

SCRIPTS = Path(__file__).resolve().parent / "scripts"
QUIET = {"main_oncpu_frac": 0.97, "main_runq_frac": 0.01, "cpu_mhz": 2400.0}


def _feed(steps: list[tuple[dict[str, float], dict[str, float]]]
          ) -> list[tuple[str, int | None, str, dict[str, float]]]:
    """(record fields, condition sample) per step: the sample first, as the writer
    thread writes it before the rules run."""
    rules = LiveRules(RulesConfig(), "exp", 0)  # warm-up 5 steps, 3 in a row
    out = []
    for step, (rec, sample) in enumerate(steps):
        rules.observe_conditions({"wall_time_s": float(step), **sample})
        for a in rules.observe({"rank": 0, "step": step, **rec}, 0.0):
            if a.rule in ("contention", "throttling"):  # (the step-time rule fires too)
                out.append((a.rule, a.step, a.message, dict(a.values)))
    return out


def _quiet(n: int) -> list[tuple[dict[str, float], dict[str, float]]]:
    return [({"step_time_s": 0.1, "cpu_s": 0.098, "preempt": 1.0}, QUIET)] * n


def test_contention_fires_with_the_numbers_of_the_starved_thread() -> None:
    starved = ({"step_time_s": 0.3, "cpu_s": 0.075, "preempt": 60.0},
               {"main_oncpu_frac": 0.25, "main_runq_frac": 0.7, "cpu_mhz": 2400.0})
    got = _feed(_quiet(30) + [starved] * 20)
    # Step 32 is the first whose latest 5 steps are slow (median); 3 in a row: step 34.
    assert [(rule, step) for rule, step, _, _ in got] == [("contention", 34)]
    assert got[0][2] == (
        "the host is contended: steps take 3.0x as long as in steps 5-29 (0.3 s against "
        "0.1 s); the training thread ran 25% of the wall time against 97% and waited for a "
        "CPU 70% of it against 1%")
    values = got[0][3]
    assert (values["step_time_s"], values["ref_step_time_s"]) == (0.3, 0.1)
    assert (values["main_runq_frac"], values["ref_main_runq_frac"]) == (0.7, 0.01)
    assert values["cpu_per_wall"] == pytest.approx(0.25)
    assert values["preempt_per_s"] == pytest.approx(200.0)


def test_throttling_fires_on_a_clock_held_down() -> None:
    slow_clock = ({"step_time_s": 0.2, "cpu_s": 0.196, "preempt": 2.0},
                  {**QUIET, "cpu_mhz": 1200.0})
    got = _feed(_quiet(30) + [slow_clock] * 20)
    assert [(rule, step) for rule, step, _, _ in got] == [("throttling", 34)]
    assert got[0][2] == ("the clock is throttled: steps take 2.0x as long as in steps 5-29 "
                         "(0.2 s against 0.1 s); CPU clock 1,200 MHz against 2,400 MHz in "
                         "steps 5-29")


def test_what_the_host_does_not_explain_or_does_not_cost_fires_nothing() -> None:
    sleeping = ({"step_time_s": 0.3, "cpu_s": 0.098, "preempt": 1.0}, QUIET)  # waits, alone
    busy_free = ({"step_time_s": 0.1, "cpu_s": 0.098, "preempt": 30.0},
                 {"main_oncpu_frac": 0.6, "main_runq_frac": 0.4, "cpu_mhz": 2400.0})
    for tail in (sleeping, busy_free):
        assert _feed(_quiet(30) + [tail] * 30) == []
    rnd = random.Random(0)
    noisy = [({"step_time_s": 0.1 * (1 + 0.3 * rnd.random()), "cpu_s": 0.09,
               "preempt": rnd.randint(0, 5)},
              {"main_oncpu_frac": 0.9 + 0.05 * rnd.random(),
               "main_runq_frac": 0.03 * rnd.random(), "cpu_mhz": 2400 - 100 * rnd.random()})
             for _ in range(500)]
    assert _feed(noisy) == []


def test_disabled_environment_rules_stay_quiet() -> None:
    starved = ({"step_time_s": 0.3, "cpu_s": 0.075, "preempt": 60.0},
               {"main_oncpu_frac": 0.25, "main_runq_frac": 0.7})
    rules = LiveRules(RulesConfig(disable=("contention",), step_time_factor=100.0), "e", 0)
    fired = []
    for step, (rec, sample) in enumerate(_quiet(30) + [starved] * 20):
        rules.observe_conditions(sample)
        fired += rules.observe({"step": step, **rec}, 0.0)
    assert fired == []


CPU = 0  # the run and the hogs share this CPU, whatever else the host runs
def _rows(run: Path) -> int:
    path = run / "steps" / "rank-00000.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _alerts(run: Path) -> list[dict[str, Any]]:
    if not (run / "events.jsonl").exists():
        return []
    events, _ = RunDir.open(run).read_events(type="alert")
    return events


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity")
def test_a_real_cpu_hog_beside_a_real_run_fires_host_contended(tmp_path: Path) -> None:
    run, stop = tmp_path / "run", tmp_path / "stop"
    alerts = tmp_path / "alerts.toml"
    alerts.write_text("[rules]\nstall_after_s = 600\n")  # console only
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE_")}
    trainer = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "cpu_steps.py"), str(run), str(alerts), str(stop),
         "--cpu", str(CPU)], env=env, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while _rows(run) < 60:  # a quiet reference first (warm-up 5, then 12+ steps)
            assert trainer.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        hog_from = _rows(run)
        with cpu_hogs(4, CPU, limit_s=120):  # the run gets at most a fifth of its CPU
            while not [a for a in _alerts(run) if a["rule"] == "contention"]:
                assert trainer.poll() is None and time.monotonic() < deadline, _alerts(run)
                time.sleep(0.2)
        stop.touch()
        assert trainer.wait(timeout=60) == 0
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait(timeout=10)
    [alert] = [a for a in _alerts(run) if a["rule"] == "contention"]
    assert alert["step"] >= hog_from - 1
    assert alert["message"].startswith("the host is contended: steps take ")
    v = alert["values"]
    assert v["step_time_s"] >= 1.2 * v["ref_step_time_s"]
    # The evidence is the thread's own accounting: less CPU per wall-second than before.
    assert v["cpu_per_wall"] < v["ref_cpu_per_wall"]
