"""An alert is "accepted" only on the platform's own success answer, never on a redirect
or an error code in a 200; a slow-drip endpoint cannot hold the sender past its deadline.
Real local HTTP servers (tests/support/odd_endpoints.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from stepscope.alerts import Dispatcher, SinkConfig
from stepscope.alerts.platforms import HttpRequest
from stepscope.alerts.transport import HttpAnswer, post
from support.alerting import alert, deliver
from support.odd_endpoints import OddAnswers, SlowDrip


@pytest.fixture
def odd() -> Iterator[OddAnswers]:
    server = OddAnswers()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("kind", ["wecom", "webhook"])
@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_a_failure_and_the_target_never_gets_a_get(
        odd: OddAnswers, kind: str, status: int) -> None:
    s = SinkConfig(type=kind, name="hook", url=f"{odd.base}/redirect/{status}", retries=0,
                   timeout_s=5.0)
    [rec] = deliver([s], [alert()])
    outcome = rec["delivery"]["hook"]
    assert outcome.startswith(f"failed after 1 attempt: HTTP {status}"), outcome
    assert "redirect not followed" in outcome
    assert [(m, p) for m, p, _ in odd.seen] == [("POST", f"/redirect/{status}")]


def test_a_200_with_a_nonzero_errcode_is_a_failure_on_a_generic_webhook(
        odd: OddAnswers) -> None:
    # A gateway relaying to a WeCom/DingTalk robot answers 200 with the robot's errcode.
    # (The robot sink types read their codes already: test_platform_delivery.py.)
    s = SinkConfig(type="webhook", name="hook", url=f"{odd.base}/errcode/40014", retries=0)
    [rec] = deliver([s], [alert()])
    assert rec["delivery"]["hook"].startswith("failed after 1 attempt:"), rec
    assert "40014" in rec["delivery"]["hook"]


@pytest.mark.parametrize("status", [302, 307])
def test_alerts_test_exits_nonzero_on_a_redirect(tmp_path: Path, odd: OddAnswers,
                                                 status: int) -> None:
    f = tmp_path / "alerts.toml"
    f.write_text(f'[[sink]]\ntype = "webhook"\nname = "pager"\n'
                 f'url = "{odd.base}/redirect/{status}"\nretries = 0\n')
    proc = subprocess.run([sys.executable, "-m", "stepscope", "alerts", "test", str(f)],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"pager: failed after 1 attempt: HTTP {status} redirect" in proc.stdout
    assert all(m == "POST" for m, _, _ in odd.seen) and len(odd.seen) == 1


@pytest.mark.parametrize("where", ["headers", "body"])
def test_a_slow_drip_answer_ends_at_its_deadline(where: str) -> None:
    # One byte every 2 s: each read finishes well inside the 3 s timeout, so only a total
    # deadline ends the request (before, it lasted as long as the endpoint dripped).
    drip = SlowDrip(where=where, drip_s=2.0, drip_for_s=40.0)
    try:
        t0 = time.monotonic()
        answer = post(HttpRequest(drip.url, b"{}", {"Content-Type": "application/json"}),
                      timeout_s=3.0)
        took_s = time.monotonic() - t0
    finally:
        drip.stop()
    assert answer == HttpAnswer(None, error="timed out after 3 s")
    assert 2.9 <= took_s < 4.5, took_s


def test_after_a_slow_drip_the_next_alert_is_still_delivered() -> None:
    # One dispatcher, as in a live run: its single sender thread must be free again soon
    # after the first request's deadline, or every later alert of the run waits behind it.
    drip = SlowDrip(where="body", drip_s=2.0, drip_for_s=40.0)
    s = SinkConfig(type="webhook", name="hook", url=drip.url, retries=0, timeout_s=3.0)
    records: list[Mapping[str, Any]] = []
    d = Dispatcher([s], record=records.append, gather_s=0.0)
    try:
        assert d.submit(alert(rule="step_time"))
        assert d.wait_idle(8.0), "the first request outlived its 3 s deadline"
        assert d.submit(alert(rule="stall"))
        assert d.wait_idle(8.0)
    finally:
        d.close(1.0)
        drip.stop()
    first, second = records
    assert first["delivery"]["hook"] == "failed after 1 attempt: no answer (timed out after 3 s)"
    assert second["rule"] == "stall" and second["delivery"]["hook"].startswith("accepted")
    [body] = drip.received
    assert json.loads(body)["alerts"][0]["rule"] == "stall"
