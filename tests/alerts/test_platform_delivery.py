"""Each platform gets the message its robot accepts, signed the way it documents; a wrong
secret is refused by the robot and recorded as such; no secret reaches events."""

from __future__ import annotations

import json

import pytest

from stepscope.alerts import Alert, SinkConfig
from support.alerting import alert, deliver, sink
from support.chat_robots import DING_SECRET, DING_TOKEN, WECOM_KEY, ChatRobots


@pytest.mark.parametrize("kind, msgtype", [
    ("wecom", "text"), ("wecom", "markdown"), ("dingtalk", "text"), ("dingtalk", "markdown"),
    ("feishu", "text"), ("slack", "text"), ("webhook", "text")])
def test_each_platform_accepts_the_signed_message(robots: ChatRobots, kind: str,
                                                  msgtype: str) -> None:
    records = deliver([sink(robots, kind, msgtype=msgtype)], [alert()])
    assert robots.state.refused == []
    [received] = robots.state.accepted
    assert received.platform == kind
    text = robots.state.texts(kind)[0] if kind != "webhook" else received.body["text"]
    assert "step_time" in text and "stepscope diagnose" in text and "exp1" in text
    [rec] = records
    assert rec["type"] == "alert" and rec["rule"] == "step_time"
    assert rec["delivery"][kind].startswith("accepted")
    if kind == "webhook":
        assert received.body["alerts"][0]["values"] == {"step_time_s": 0.9, "median_s": 0.3}


def test_mentions_use_each_platforms_fields(robots: ChatRobots) -> None:
    mention = ("13800000000", "alice", "@all")
    deliver([sink(robots, "wecom", mention=mention), sink(robots, "dingtalk", mention=mention)],
            [alert()])
    bodies = {r.platform: r.body for r in robots.state.accepted}
    assert bodies["wecom"]["text"]["mentioned_mobile_list"] == ["13800000000"]
    assert bodies["wecom"]["text"]["mentioned_list"] == ["alice", "@all"]
    assert bodies["dingtalk"]["at"] == {"atMobiles": ["13800000000"], "atUserIds": ["alice"],
                                        "isAtAll": True}


def test_wrong_secret_is_refused_by_the_robot_and_recorded(robots: ChatRobots) -> None:
    bad = SinkConfig(type="dingtalk", name="ding", url=robots.url("dingtalk"),
                     secret="SECwrong-secret-xyz", keyword="stepscope")
    bad_fs = SinkConfig(type="feishu", name="fs", url=robots.url("feishu"),
                        secret="wrong-feishu-secret")
    records = deliver([bad, bad_fs], [alert()])
    assert sorted(robots.state.refused) == [("dingtalk", "sign"), ("feishu", "sign")]
    assert records[0]["delivery"]["ding"].startswith("failed after 1 attempt: code 310000")
    assert records[0]["delivery"]["fs"].startswith("failed after 1 attempt: code 19021")
    dumped = json.dumps(records)
    for secret in ("SECwrong-secret-xyz", "wrong-feishu-secret", DING_TOKEN, WECOM_KEY):
        assert secret not in dumped


def test_missing_keyword_is_refused_by_dingtalk(robots: ChatRobots) -> None:
    s = SinkConfig(type="dingtalk", name="ding", url=robots.url("dingtalk"), secret=DING_SECRET)
    robots.state.keyword = "must-contain-this"
    deliver([s], [alert()])
    assert robots.state.refused == [("dingtalk", "keyword")]


def test_long_stack_is_cut_to_the_wecom_byte_limit(robots: ChatRobots) -> None:
    long = Alert(rule="stall", severity="critical", run="exp1", rank=0, step=5,
                 message="no step for 30 s", next_step="look at the stack", source="watchdog",
                 detail="File \"train.py\", line 1, in 等待\n" * 400)
    deliver([sink(robots, "wecom")], [long])
    assert robots.state.refused == []
    text = robots.state.texts("wecom")[0]
    assert len(text.encode()) <= 2048 and text.endswith("(truncated)")


def test_min_severity_and_cool_down(robots: ChatRobots) -> None:
    s = sink(robots, "wecom", min_severity="critical")
    records = deliver([s], [alert(severity="warning"), alert(rank=1, severity="critical"),
                            alert(rank=1, severity="critical")], cooldown_s=300.0)
    outcomes = sorted(json.dumps(r["delivery"]) for r in records)
    assert outcomes[0] == '{"all": "suppressed: same alert within the cool-down"}'
    assert outcomes[1].startswith('{"wecom": "accepted')
    assert outcomes[2] == '{"wecom": "skipped: below min_severity critical"}'
    assert len(robots.state.accepted) == 1
