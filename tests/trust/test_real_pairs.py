"""Judgments on a real, noisy machine: real runs of ``loop.py``, real CPU hogs.

Every run is a real process recorded by ``stepscope.Recorder`` with its conditions
sampler. A hog is ``python -c 'while True: pass'`` pinned to the CPU the run is pinned to,
started and stopped by the test and bounded by ``timeout`` (so a crashed test leaves no
hog behind). Nothing here asserts a wall-clock time: the assertions are on verdicts,
regimes and findings, and where the host's own load could legitimately change the outcome
the test checks that load in the runs' raw records before accepting it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from stepscope.cli import main
from support.procs import cpu_hogs

LOOP = Path(__file__).with_name("loop.py")
CPU = 0  # runs and hogs share this CPU, so a hog contends whatever else the host runs
N_HOGS = 5  # the run gets at most a sixth of its CPU, whatever else the host runs
HOG_LIMIT_S = 180  # `timeout` bound on each hog's life

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"),
                                reason="needs Linux CPU affinity")


def run_loop(out: Path, steps: int, work: int = 1) -> None:
    cmd = [sys.executable, str(LOOP), str(out), "--steps", str(steps), "--work", str(work),
           "--cpu", str(CPU)]
    subprocess.run(cmd, check=True, timeout=240, capture_output=True)


def hogs(n: int = N_HOGS) -> contextlib.AbstractContextManager[None]:
    return cpu_hogs(n, CPU, HOG_LIMIT_S)


def cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    with pytest.raises(SystemExit) as exc:
        main([*args, "--json"])
    assert exc.value.code in (0, None), capsys.readouterr().err
    return orjson.loads(capsys.readouterr().out)


def raw_medians(run: Path) -> dict[str, float]:
    """The runs' own records, read without stepscope: CPU per wall-second per step, and
    the training thread's on-CPU share from the condition samples."""
    steps = [orjson.loads(x) for x in (run / "steps" / "rank-00000.jsonl").read_bytes()
             .splitlines() if x.strip()]
    conds = [orjson.loads(x) for x in (run / "conditions" / "rank-00000.jsonl").read_bytes()
             .splitlines() if x.strip()]
    cpu = [r["cpu_s"] / r["step_time_s"] for r in steps[5:] if r.get("cpu_s") is not None]
    on = [c["main_oncpu_frac"] for c in conds if "main_oncpu_frac" in c]
    return {"cpu_per_wall": float(np.median(cpu)),
            "main_oncpu_frac": float(np.median(on)) if on else float("nan")}


def test_cpu_hog_beside_one_run_makes_compare_inconclusive(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The hogs must actually have taken B's CPU (checked in the raw records: less than
    0.8x A's on-CPU share); if the host happened to starve A as much, the pair is
    retried once."""
    for attempt in range(2):
        a, b = tmp_path / f"a{attempt}", tmp_path / f"b{attempt}"
        run_loop(a, steps=120)
        with hogs():
            run_loop(b, steps=120)
        ma, mb = raw_medians(a), raw_medians(b)
        if mb["main_oncpu_frac"] < 0.8 * ma["main_oncpu_frac"]:
            break
    else:
        pytest.fail(f"the hogs did not contend run B more than the host contended A: "
                    f"{ma} vs {mb}")
    r = cli_json(capsys, "compare", str(a), str(b))
    assert r["differing"] == []
    assert r["verdict"] == "inconclusive", (r["speed"]["reason"], r["environment"], ma, mb)
    assert (r["verdict"], r["speed"]["verdict"]) == ("inconclusive", "inconclusive")
    assert "contention" in r["speed"]["reason"]
    contention = [e for e in r["environment"] if e["condition"] == "contention"]
    assert contention, r["environment"]
    assert all(isinstance(e["a"], float) and isinstance(e["b"], float) for e in contention)


def test_extra_compute_per_step_on_a_quiet_host_is_slower(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Twice the work per step is `slower`. Other tests may load this shared host between
    the two runs (slowing A as much as B's extra work does); any other verdict is accepted
    only when the runs' raw records show the load changed, and the pair is then retried
    (at most three times). On a steady host it must be `slower`."""
    for attempt in range(3):
        a, b = tmp_path / f"a{attempt}", tmp_path / f"b{attempt}"
        run_loop(a, steps=80)
        run_loop(b, steps=80, work=2)
        r = cli_json(capsys, "compare", str(a), str(b))
        assert r["differing"] == []
        if r["speed"]["verdict"] == "slower":
            assert r["verdict"] == "not landed"
            assert r["speed"]["tokens_per_s"]["change"] == "worse"
            return
        ma, mb = raw_medians(a), raw_medians(b)
        shares = [min(ma[k], mb[k]) / max(ma[k], mb[k]) for k in ma if np.isfinite(ma[k])
                  and np.isfinite(mb[k])]
        assert min(shares) < 0.9, (r["speed"], ma, mb)  # not slower on a steady host: a bug
    pytest.fail("the host's load changed between the runs in three attempts")


def test_extra_compute_interleaved_is_slower(tmp_path: Path) -> None:
    """The same regression with both runs interleaved in one process, step by step, so the
    host's load hits both alike: the verdict must be `slower`, whatever else runs."""
    import stepscope
    from stepscope.analysis.compare.runs import compare_runs
    from stepscope.rundir.store import RunDir

    rng = np.random.default_rng(0)
    m = rng.standard_normal((256, 256)) / 16.0
    # No CPU accounting: in one process each recorder's getrusage delta would span the
    # other run's step too (the subprocess tests above cover the accounting).
    recs = {w: stepscope.Recorder(tmp_path / f"w{w}", rank=0, background=False,
                                  no_usage=True, meta={"baseline": {"model_name": "mm"}})
            for w in (1, 2)}
    for _ in range(60):
        for w, rec in recs.items():
            with rec.step(tokens=128.0):
                x = m
                for _ in range(6 * w):
                    x = np.tanh(x @ m)
    for rec in recs.values():
        rec.close()
    (ta, _), (tb, _) = (RunDir(tmp_path / f"w{w}").read_steps() for w in (1, 2))
    ma, mb = (RunDir(tmp_path / f"w{w}").read_meta() for w in (1, 2))
    r = compare_runs(ta, ma, tb, mb, n_boot=400)
    assert (r.speed.verdict, r.verdict) == ("slower", "not landed"), r.speed.reason


def _wait_for_steps(run: Path, n: int, proc: subprocess.Popen[bytes]) -> int:
    """Wait until ``n`` steps are on disk; returns how many are (the writer flushes in
    batches, so the hogs start at that step or a little after it)."""
    path = run / "steps" / "rank-00000.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        done = path.read_bytes().count(b"\n") if path.is_file() else 0
        if done >= n:
            return done
        time.sleep(0.05)
    raise AssertionError(f"the run did not reach {n} steps")


def test_host_busy_halfway_gives_two_regimes_and_no_compute_advice_for_the_busy_part(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "half"
    cmd = [sys.executable, str(LOOP), str(run), "--steps", "200", "--cpu", str(CPU)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        hog_step = _wait_for_steps(run, 70, proc)
        with hogs():
            proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    sheet = cli_json(capsys, "report", str(run), "--no-html")
    regimes = sheet["regimes"]
    assert len(regimes) >= 2, regimes
    # The stretch under the hogs is contention; the steady regime is from before them.
    # (Other tests on this host may make more regimes in the first part; those are
    # attributed too but not asserted on.)
    last = regimes[-1]
    assert last["cause"] == "contention" and last["first_step"] >= hog_step - 20, regimes
    steady = next(g for g in regimes if g["steady"])
    # hog_step is a lower bound of the step the hogs began at (the writer flushes in
    # batches), so the steady regime is checked against the contended one, not it
    assert sheet["steady_regime"] == steady["name"]
    assert steady["last_step"] < last["first_step"]
    assert any("regimes" in n for n in sheet["notes"])
    d = cli_json(capsys, "diagnose", str(run))
    env = [f for f in d["findings"] if f["category"] == "environment"]
    assert any("contention" in f["message"] for f in env), d["findings"]
    first_busy = last["first_step"]
    for f in d["findings"]:
        if f["category"] == "compute":  # the compute note covers the quiet steps only
            last = int(f["evidence"]["steps"].split("-")[1])
            assert last < first_busy, f
        if f["category"] == "throughput_regression":
            assert f["severity"] == "info" and "explained_by" in f["evidence"], f
    assert d["bottleneck"] != "compute"
