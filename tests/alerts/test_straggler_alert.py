"""The in-process straggler alert: a real 2-rank torchrun (gloo) job under `stepscope run
--alerts`, one rank's forward sleeping extra every step; rank 0 fires one alert for that
rank after M gathers in a row and its webhook receives it (the other rank sends nothing)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.rundir.store import RunDir
from support.chat_robots import ChatRobots

SCRIPTS = Path(__file__).resolve().parent / "scripts"
BIN = Path(sys.executable).parent
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (BIN / "torchrun").exists(), reason="needs torchrun")]


def test_a_rank_that_sleeps_extra_every_step_is_reported_by_rank_0(
        tmp_path: Path, robots: ChatRobots) -> None:
    alerts = tmp_path / "alerts.toml"
    alerts.write_text(f'[rules]\nstall_after_s = 600\nconsecutive = 3\n[[sink]]\n'
                      f'type = "webhook"\nurl = "{robots.url("webhook")}"\n')
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE_")}
    proc = subprocess.run(
        [sys.executable, "-m", "stepscope", "run", "--alerts", str(alerts),
         "--cross-rank-every", "5", "--out", str(out), "--", str(BIN / "torchrun"),
         "--standalone", "--nproc-per-node", "2", str(SCRIPTS / "ddp_slow_rank.py"),
         "--steps", "40", "--slow-rank", "1", "--extra-ms", "60"],
        capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events, _ = RunDir.open(out).read_events()
    views = [e for e in events if e.get("type") == "cross_rank" and "stragglers" in e]
    alerts_ = [e for e in events if e.get("type") == "alert" and e["rule"] == "straggler"]
    assert len(alerts_) == 1, alerts_
    [alert] = alerts_
    # The gathers flagging rank 1, in order: the alert comes at the M-th one in a row.
    flagged = [v["step"] for v in views if v["stragglers"] == [1]]
    assert len(flagged) >= 3 and alert["step"] in flagged[2:]
    assert alert["rank"] == 1 and alert["values"]["score"] < alert["values"]["threshold"] == 0.8
    assert alert["message"].startswith("rank 1 is a straggler in 3 gathers in a row: score ")
    assert alert["delivery"]["webhook#1"].startswith("accepted")
    [received] = [r for r in robots.state.accepted if "straggler" in r.body["text"]]
    assert received.body["alerts"][0]["rank"] == 1
