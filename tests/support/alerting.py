"""Alerts and sinks for the alert tests: one realistic alert, a sink per local robot."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stepscope.alerts import Alert, Dispatcher, SinkConfig

from .chat_robots import DING_SECRET, FEISHU_SECRET, ChatRobots


def alert(rank: int = 0, rule: str = "step_time", severity: str = "warning") -> Alert:
    return Alert(rule=rule, severity=severity, run="exp1", rank=rank, step=120,  # type: ignore[arg-type]
                 message="step time 3.0x the steady median, 3 steps in a row",
                 next_step="run `stepscope diagnose RUN`", source="median rule",
                 values={"step_time_s": 0.9, "median_s": 0.3}, time_s=1.0)


def sink(robots: ChatRobots, kind: str, **kw: Any) -> SinkConfig:
    secret = {"dingtalk": DING_SECRET, "feishu": FEISHU_SECRET}.get(kind, "")
    return SinkConfig(type=kind, name=kind, url=robots.url(kind), secret=secret,
                      keyword="stepscope", **kw)


def deliver(sinks: list[SinkConfig], alerts: list[Alert], **kw: Any) -> list[Mapping[str, Any]]:
    records: list[Mapping[str, Any]] = []
    d = Dispatcher(sinks, record=records.append, **kw)
    for a in alerts:
        assert d.submit(a)
    assert d.wait_idle(30.0)
    d.close(1.0)
    return records
