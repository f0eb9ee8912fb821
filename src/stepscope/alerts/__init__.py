"""Live monitoring and alerts: the alert file, the rules, delivery to chat robots.

Example::

    from stepscope.alerts import load_alerts_config, Dispatcher
    cfg = load_alerts_config("alerts.toml")           # one-line error naming the bad key
    d = Dispatcher(cfg.sinks, record=run.append_event, cooldown_s=cfg.rules.cooldown_s)
    d.submit(alert)                                    # never blocks the caller
"""

from .config import (
    AlertConfigError,
    AlertsConfig,
    RulesConfig,
    SinkConfig,
    load_alerts_config,
)
from .delivery import Dispatcher
from .model import Alert
from .selftest import send_test_message

__all__ = [
    "Alert",
    "AlertConfigError",
    "AlertsConfig",
    "Dispatcher",
    "RulesConfig",
    "SinkConfig",
    "load_alerts_config",
    "send_test_message",
]
