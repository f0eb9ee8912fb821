"""``stepscope alerts test``: one test message through every sink, each sink's outcome.

Example::

    outcomes = send_test_message(load_alerts_config("alerts.toml"), run_name="check")
    all(o.startswith("accepted") for o in outcomes.values())
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from .config import AlertsConfig
from .delivery import Dispatcher
from .model import Alert

__all__ = ["send_test_message"]


def send_test_message(config: AlertsConfig, run_name: str = "alerts-test",
                      timeout_s: float = 30.0) -> dict[str, str]:
    """Send one critical test alert to every sink; sink name -> outcome."""
    records: list[Mapping[str, Any]] = []
    # min_severity is ignored for the test (critical passes every filter), and no cool-down.
    dispatcher = Dispatcher(config.sinks, record=records.append, cooldown_s=0.0, gather_s=0.0)
    dispatcher.submit(Alert(
        rule="test", severity="critical", run=run_name, rank=None, step=None,
        message="test message from `stepscope alerts test`; alerts reach this channel",
        next_step="nothing to do: this is a test", source="stepscope alerts test",
        time_s=time.time()))
    dispatcher.wait_idle(timeout_s)
    dispatcher.close(timeout_s=1.0)
    outcomes = {s.name: "not sent: no answer in time" for s in config.sinks}
    for rec in records:
        delivery = rec.get("delivery", {})
        if isinstance(delivery, Mapping):
            outcomes.update({str(k): str(v) for k, v in delivery.items()})
    return outcomes
