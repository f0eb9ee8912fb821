"""Over the limit, alerts are folded (not lost, not sent in a burst); a slow, failing or
absent endpoint costs retries on the sender thread, never the caller's time."""

from __future__ import annotations

import re
import threading
import time

from stepscope.alerts import Dispatcher, SinkConfig
from stepscope.alerts.limits import WindowLimiter
from stepscope.alerts.platforms import interpret
from support.alerting import alert, deliver, sink
from support.chat_robots import ChatRobots


def _carried(text: str) -> int:
    m = re.search(r"(\d+) alerts folded", text)
    return int(m.group(1)) if m else 1


def test_window_limiter_keeps_the_platform_limit_in_every_window() -> None:
    lim = WindowLimiter([(20, 60.0)])
    sent = []
    t = 0.0
    while len(sent) < 45:
        t = lim.next_free(t)
        lim.record(t)
        sent.append(t)
    assert sent[:3] == [0.0, 3.0, 6.0]  # spaced by 60/20 s: no burst
    assert all(sum(1 for s in sent if a <= s < a + 60.0) <= 20 for a in sent)


def test_feishu_limiter_keeps_both_windows() -> None:
    lim = WindowLimiter([(100, 60.0), (5, 1.0)])
    assert lim.next_free(0.0) == 0.0
    lim.record(0.0)
    assert lim.next_free(0.0) == 0.6  # 60/100 s apart, which also keeps 5 per second


def test_a_storm_is_folded_into_few_messages_that_count_every_alert(robots: ChatRobots) -> None:
    storm = [alert(rank=r) for r in range(50)]  # one rule firing on 50 ranks at once
    records = deliver([sink(robots, "wecom")], storm)
    texts = robots.state.texts("wecom")
    assert robots.state.refused == []
    assert 1 <= len(texts) <= 2
    assert sum(_carried(t) for t in texts) == 50
    assert len(records) == 50 and all(r["delivery"]["wecom"].startswith("accepted")
                                      for r in records)


def test_alerts_over_the_limit_wait_and_fold_instead_of_being_refused(
        robots: ChatRobots) -> None:
    # The robot's window is scaled to 2 per 2 s so the test is short; the sink is told the
    # same limit, as a private gateway's limit is configured.
    robots.state.limits["wecom"] = [(2, 2.0)]
    s = sink(robots, "wecom", rate_limit=2, rate_window_s=2.0)
    records: list = []
    d = Dispatcher([s], record=records.append, gather_s=0.0)
    for r in range(8):
        d.submit(alert(rank=r))
        time.sleep(0.3)
    assert d.wait_idle(30.0)
    d.close(1.0)
    texts = robots.state.texts("wecom")
    assert robots.state.refused == []
    assert sum(_carried(t) for t in texts) == 8
    assert len(texts) < 8  # some were folded
    times = [r.time_s for r in robots.state.accepted]
    assert all(sum(1 for t in times if a <= t < a + 2.0) <= 2 for a in times)


def test_slack_429_retry_after_is_honoured(robots: ChatRobots) -> None:
    # The sink believes it may send 10/s; this webhook allows 1 per 5 s (scaled up from
    # Slack's 1/s so a loaded test machine still sends the second inside the window) and
    # answers 429 + Retry-After.
    robots.state.limits["slack"] = [(1, 5.0)]
    s = sink(robots, "slack", rate_limit=10, rate_window_s=1.0)
    records: list = []
    d = Dispatcher([s], record=records.append, gather_s=0.0)
    d.submit(alert(rank=0))
    assert d.wait_idle(10.0)
    d.submit(alert(rank=1))
    assert d.wait_idle(30.0)
    d.close(1.0)
    assert robots.state.refused == [("slack", "rate")]
    assert [r["delivery"]["slack"].split(":")[0] for r in records] == ["accepted", "accepted"]
    assert len(robots.state.accepted) == 2


def test_failing_endpoint_is_retried_with_backoff_then_recorded(robots: ChatRobots) -> None:
    robots.state.mode = "fail"
    records = deliver([sink(robots, "wecom", retries=2)], [alert()])
    assert records[0]["delivery"]["wecom"] == "failed after 3 attempts: HTTP 500 internal error"


def test_absent_endpoint_is_recorded_not_raised(robots: ChatRobots) -> None:
    s = sink(robots, "dingtalk", retries=1)
    robots.stop()
    records = deliver([s], [alert()])
    outcome = records[0]["delivery"]["dingtalk"]
    assert outcome.startswith("failed after 2 attempts: no answer (")
    assert "refused" in outcome.lower()


def test_slow_endpoint_times_out_on_the_sender_thread(robots: ChatRobots) -> None:
    robots.state.mode, robots.state.delay_s = "slow", 3.0
    records = deliver([sink(robots, "feishu", timeout_s=0.5, retries=0)], [alert()])
    assert records[0]["delivery"]["feishu"] == (
        "failed after 1 attempt: no answer (timed out after 0.5 s)")


def test_submit_never_waits_even_when_the_sender_is_stuck(robots: ChatRobots) -> None:
    robots.state.mode, robots.state.delay_s = "slow", 5.0
    d = Dispatcher([sink(robots, "wecom", timeout_s=5.0)], queue_size=10, gather_s=0.0)
    assert d.submit(alert(rank=999))
    for _ in range(1000):  # the sender has taken it and is now waiting on the robot
        if d._queue.unfinished_tasks == 0:
            break
        time.sleep(0.01)
    results = []
    caller = threading.Thread(target=lambda: results.extend(
        d.submit(alert(rank=r)) for r in range(200)))
    caller.start()
    caller.join(timeout=30.0)
    assert not caller.is_alive()
    # The sender is stuck for 5 s: the queue's 10 places fill, the rest is refused at once.
    assert results.count(True) == 10 and d.dropped == results.count(False) == 190
    d.close(0.1)


def test_platform_rate_codes_mean_wait_not_fail() -> None:
    ding = interpret("dingtalk", 200, b'{"errcode":130101,"errmsg":"send too fast"}', {}, "")
    assert (ding.status, ding.retry_after_s) == ("throttled", 600.0)  # robot off for 10 min
    wecom = interpret("wecom", 200, b'{"errcode":45009,"errmsg":"freq"}', {}, "")
    assert wecom.status == "throttled"
    assert interpret("feishu", 200, b'{"code":11232,"msg":"frequency limited"}', {},
                     "").status == "throttled"
    assert interpret("slack", 429, b"", {"Retry-After": "7"}, "").retry_after_s == 7.0
    assert interpret("wecom", 200, b'{"errcode":93000,"errmsg":"bad"}', {}, "").status == (
        "rejected")


def test_console_prints_one_line_and_folds_a_burst() -> None:
    import io
    out = io.StringIO()
    cfg = SinkConfig(type="console", name="console", min_severity="info")
    d = Dispatcher([cfg], console=out)
    for r in range(5):
        d.submit(alert(rank=r))
    assert d.wait_idle(10.0)
    d.close(1.0)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and "5 alerts folded" in lines[0]
