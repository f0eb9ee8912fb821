"""The alert file (TOML): ``[rules]`` overrides and one ``[[sink]]`` table per destination.

Example file::

    [rules]
    step_time_factor = 2.0      # a step slower than 2x the run's steady median ...
    consecutive = 3             # ... this many steps in a row fires
    stall_after_s = 600         # no step finished for 10 minutes fires the watchdog

    [[sink]]
    type = "dingtalk"
    url_env = "DINGTALK_WEBHOOK"      # secrets come from the environment or a file,
    secret_env = "DINGTALK_SECRET"    # never from run directories
    keyword = "stepscope"
    min_severity = "warning"

Every mistake is one :class:`AlertConfigError` line naming the file and the key, raised by
:func:`load_alerts_config` before training starts. Webhook URLs carry tokens (WeCom's
``key``, DingTalk's ``access_token``), so URLs are treated as secrets too: they are not in
any ``repr`` and never written anywhere by stepscope.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import ConfigError, StepscopeError
from .baseline import baseline_numbers
from .model import SEVERITIES

_toml: Any
if sys.version_info >= (3, 11):
    import tomllib as _toml
else:  # pragma: no cover - Python 3.10 takes the same parser from PyPI (extra "alerts")
    try:
        import tomli as _toml  # type: ignore[no-redef]
    except ImportError:
        _toml = None

__all__ = ["AlertConfigError", "AlertsConfig", "RulesConfig", "SinkConfig",
           "load_alerts_config", "SINK_TYPES", "RULE_NAMES"]

SINK_TYPES = ("console", "wecom", "dingtalk", "feishu", "slack", "webhook")
RULE_NAMES = ("step_time", "throughput", "data_wait", "nonfinite_loss", "loss_spike",
              "grad_norm", "loss_scale", "memory_creep", "straggler", "stall", "contention",
              "throttling")
_SIGNED = ("dingtalk", "feishu")  # platforms whose robots take a signing secret
_MSGTYPES = {"wecom": ("text", "markdown"), "dingtalk": ("text", "markdown")}


class AlertConfigError(ConfigError):
    """The alert file is unreadable or a key in it is wrong; the message names the key."""


@dataclass(frozen=True)
class RulesConfig:
    """Thresholds of the live rules; each default is quiet on a healthy run."""

    # Field report: "if the step time exceeds a threshold M times in a row". 2x the run's own
    # steady median is far above step-to-step noise (a loaded shared CPU wobbles by ~30%),
    # 3 in a row rules out one slow step (a checkpoint save, a GC pause).
    step_time_factor: float = 2.0
    consecutive: int = 3
    # An absolute step-time limit in seconds (0 = none), for jobs with a known budget.
    max_step_time_s: float = 0.0
    # Tokens/s below this share of the steady median, `consecutive` steps in a row.
    min_tokens_per_s_frac: float = 0.5
    # Time blocked on the input pipeline above this share of the step, `consecutive` in a
    # row. Higher than diagnose's 5% (a finding on the whole run) because a live alert
    # should mean "starving now", like the field report's retry loop at <10% utilisation.
    data_wait_frac: float = 0.5
    # No step finished for this long fires the stall watchdog. 0 = automatic: the health
    # rules' stall_factor x the steady median, at least `stall_min_s`.
    stall_after_s: float = 0.0
    # Floor of the automatic stall limit: a first step (compilation, data-loader start-up)
    # can take minutes; a hang alert before then is noise.
    stall_min_s: float = 300.0
    # Steps skipped before the steady median is taken (compilation, warm-up, caches).
    warmup_steps: int = 5
    # Steps in the rolling steady window the median is taken over.
    window_steps: int = 100
    # The same alert (rule and rank) is not sent again within this many seconds.
    cooldown_s: float = 300.0
    disable: tuple[str, ...] = ()
    # Compare with a named baseline run's steady numbers instead of this run's own
    # (``baseline_run`` is read when the file is loaded; the two numbers may also be given).
    baseline_run: str = ""
    baseline_step_time_s: float = 0.0
    baseline_tokens_per_s: float = 0.0


@dataclass(frozen=True)
class SinkConfig:
    """One destination. ``url`` and ``secret`` are resolved values and never printed."""

    type: str
    name: str
    url: str = field(default="", repr=False)
    secret: str = field(default="", repr=False)
    keyword: str = ""
    min_severity: str = "warning"
    mention: tuple[str, ...] = ()
    msgtype: str = "text"
    timeout_s: float = 5.0
    retries: int = 3
    # Overrides of the platform's documented rate limit (messages per window), for private
    # gateways with their own limit; 0 keeps the platform's numbers.
    rate_limit: int = 0
    rate_window_s: float = 0.0
    # Inside a multi-rank job a chat sink sends from rank 0 only: every rank's rules run and
    # write events.jsonl, but 1,000 ranks reporting the same hang to a robot that takes 20
    # messages a minute would bury the one message that matters. True: every rank sends.
    all_ranks: bool = False


@dataclass(frozen=True)
class AlertsConfig:
    rules: RulesConfig = field(default_factory=RulesConfig)
    sinks: tuple[SinkConfig, ...] = ()
    source: str = ""  # the file it came from (a path, never a secret)


def load_alerts_config(path: str | os.PathLike[str],
                       env: Mapping[str, str] | None = None) -> AlertsConfig:
    """Read and check an alert file; secrets are resolved from ``env`` (default: os.environ)."""
    env = os.environ if env is None else env
    p = Path(path)
    if _toml is None:
        raise AlertConfigError("alert files need a TOML parser on Python 3.10: "
                               "pip install 'stepscope[alerts]'")
    try:
        doc = _toml.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise AlertConfigError(f"alert file {p}: cannot read it ({exc.strerror or exc})") from None
    except _toml.TOMLDecodeError as exc:
        raise AlertConfigError(f"alert file {p}: not valid TOML ({exc})") from None
    _check_keys(doc, {"rules", "sink"}, f"alert file {p}", "top-level key")
    rules = _rules(doc.get("rules", {}), f"alert file {p}: [rules]")
    raw_sinks = doc.get("sink", [])
    if not isinstance(raw_sinks, list):
        raise AlertConfigError(f"alert file {p}: 'sink' must be [[sink]] tables")
    sinks = tuple(_sink(s, i, env, f"alert file {p}: [[sink]] #{i + 1}")
                  for i, s in enumerate(raw_sinks))
    names = [s.name for s in sinks]
    for n in names:
        if names.count(n) > 1:
            raise AlertConfigError(f"alert file {p}: two sinks are named {n!r}; "
                                   "give each a different 'name'")
    return AlertsConfig(rules=rules, sinks=sinks, source=str(p))


def _check_keys(table: Any, allowed: set[str], where: str, what: str) -> None:
    if not isinstance(table, dict):
        raise AlertConfigError(f"{where}: expected a table")
    for key in table:
        if key not in allowed:
            raise AlertConfigError(f"{where}: unknown {what} {key!r} "
                                   f"(expected one of: {', '.join(sorted(allowed))})")


def _number(value: Any, where: str, key: str, integer: bool = False) -> float:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not math.isfinite(value) or value < 0:
        kind = "a non-negative integer" if integer else "a non-negative number"
        raise AlertConfigError(f"{where}: key {key!r} must be {kind}, got {value!r}")
    return float(value)


def _rules(table: Any, where: str) -> RulesConfig:
    defaults = RulesConfig()
    allowed = {f.name for f in fields(RulesConfig)}
    _check_keys(table, allowed, where, "key")
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key == "baseline_run":
            values.update(_baseline(value, where))
            continue
        if key == "disable":
            if not isinstance(value, list) or any(v not in RULE_NAMES for v in value):
                raise AlertConfigError(f"{where}: key 'disable' must list rule names from: "
                                       f"{', '.join(RULE_NAMES)}; got {value!r}")
            values[key] = tuple(value)
            continue
        integer = isinstance(getattr(defaults, key), int)
        num = _number(value, where, key, integer)
        values[key] = int(num) if integer else num
    if values.get("consecutive", 1) < 1:
        raise AlertConfigError(f"{where}: key 'consecutive' must be at least 1")
    if values.get("step_time_factor", 2.0) <= 1.0:
        raise AlertConfigError(f"{where}: key 'step_time_factor' must be above 1.0 "
                               f"(a factor of the steady median), got {values['step_time_factor']}")
    if values.get("window_steps", 100) < 3:
        raise AlertConfigError(f"{where}: key 'window_steps' must be at least 3")
    return RulesConfig(**values)


def _baseline(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, str) or not value:
        raise AlertConfigError(f"{where}: key 'baseline_run' must be a run directory's path")
    try:
        step_time_s, tokens_per_s = baseline_numbers(value)
    except StepscopeError as exc:
        raise AlertConfigError(f"{where}: key 'baseline_run': {exc}") from None
    return {"baseline_run": value, "baseline_step_time_s": step_time_s,
            "baseline_tokens_per_s": tokens_per_s}


_SINK_KEYS = {"type", "name", "url", "url_env", "url_file", "secret", "secret_env",
              "secret_file", "keyword", "min_severity", "mention", "msgtype", "timeout_s",
              "retries", "rate_limit", "rate_window_s", "all_ranks"}


def _sink(table: Any, index: int, env: Mapping[str, str], where: str) -> SinkConfig:
    _check_keys(table, _SINK_KEYS, where, "key")
    kind = table.get("type")
    if kind not in SINK_TYPES:
        raise AlertConfigError(f"{where}: key 'type' must be one of {', '.join(SINK_TYPES)}; "
                               f"got {kind!r}")
    where = f"{where} ({kind})"
    url = _secret(table, "url", env, where, required=kind != "console")
    secret = _secret(table, "secret", env, where, required=False)
    if secret and kind not in _SIGNED:
        raise AlertConfigError(f"{where}: key 'secret' applies to dingtalk and feishu only")
    if url and not url.startswith(("http://", "https://")):
        raise AlertConfigError(f"{where}: key 'url' must start with http:// or https://")
    sev = table.get("min_severity", "warning")
    if sev not in SEVERITIES:
        raise AlertConfigError(f"{where}: key 'min_severity' must be one of "
                               f"{', '.join(SEVERITIES)}; got {sev!r}")
    msgtype = table.get("msgtype", "text")
    if msgtype not in _MSGTYPES.get(kind, ("text",)):
        raise AlertConfigError(f"{where}: key 'msgtype' must be one of "
                               f"{', '.join(_MSGTYPES.get(kind, ('text',)))}; got {msgtype!r}")
    mention = table.get("mention", [])
    if isinstance(mention, str):
        mention = [mention]
    if not isinstance(mention, list) or not all(isinstance(m, str) for m in mention):
        raise AlertConfigError(f"{where}: key 'mention' must be a string or a list of strings")
    for key in ("keyword", "name"):
        if not isinstance(table.get(key, ""), str):
            raise AlertConfigError(f"{where}: key {key!r} must be a string")
    if not isinstance(table.get("all_ranks", False), bool):
        raise AlertConfigError(f"{where}: key 'all_ranks' must be true or false")
    return SinkConfig(
        type=kind, name=table.get("name") or f"{kind}#{index + 1}", url=url, secret=secret,
        keyword=table.get("keyword", ""), min_severity=sev, mention=tuple(mention),
        msgtype=msgtype,
        timeout_s=_number(table.get("timeout_s", 5.0), where, "timeout_s") or 5.0,
        retries=int(_number(table.get("retries", 3), where, "retries", integer=True)),
        rate_limit=int(_number(table.get("rate_limit", 0), where, "rate_limit", integer=True)),
        rate_window_s=_number(table.get("rate_window_s", 0.0), where, "rate_window_s"),
        all_ranks=table.get("all_ranks", False),
    )


def _secret(table: Mapping[str, Any], key: str, env: Mapping[str, str], where: str,
            required: bool) -> str:
    """``key`` itself, ``key_env`` (a variable's name) or ``key_file`` (a file's path)."""
    given = [k for k in (key, f"{key}_env", f"{key}_file") if k in table]
    if len(given) > 1:
        raise AlertConfigError(f"{where}: give only one of {', '.join(given)}")
    if not given:
        if required:
            raise AlertConfigError(f"{where}: key {key!r} is missing "
                                   f"(set '{key}', '{key}_env' or '{key}_file')")
        return ""
    k = given[0]
    value = table[k]
    if not isinstance(value, str) or not value:
        raise AlertConfigError(f"{where}: key {k!r} must be a non-empty string")
    if k.endswith("_env"):
        if not env.get(value):
            raise AlertConfigError(f"{where}: key {k!r}: environment variable {value} is not "
                                   "set; export it before starting")
        return env[value].strip()
    if k.endswith("_file"):
        try:
            text = Path(value).expanduser().read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise AlertConfigError(f"{where}: key {k!r}: cannot read {value} "
                                   f"({exc.strerror or exc})") from None
        if not text:
            raise AlertConfigError(f"{where}: key {k!r}: {value} is empty")
        return text
    return value
