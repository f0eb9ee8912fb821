"""Alert text: one alert in full, or a burst folded into one summary message.

Rendering is separate from the platforms so every sink says the same thing; a platform
only wraps the text in its JSON schema and cuts it at its byte limit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from .model import Alert, severity_rank

__all__ = ["Message", "render", "truncate_utf8"]

_TRUNCATED = "\n... (truncated)"


@dataclass(frozen=True)
class Message:
    title: str
    text: str  # plain text, several lines
    markdown: str
    severity: str
    count: int  # alerts it carries (1, or the size of a folded burst)


def truncate_utf8(text: str, limit_bytes: int) -> str:
    """``text`` cut to at most ``limit_bytes`` of UTF-8, never inside a character."""
    data = text.encode("utf-8")
    if len(data) <= limit_bytes:
        return text
    room = max(0, limit_bytes - len(_TRUNCATED.encode("utf-8")))
    return data[:room].decode("utf-8", errors="ignore") + _TRUNCATED


def _numbers(alert: Alert) -> str:
    parts = []
    for k, v in alert.values.items():
        parts.append(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}")
    return ", ".join(parts)


def _one(alert: Alert, keyword: str) -> Message:
    title = f"{keyword + ' ' if keyword else ''}stepscope {alert.severity}: {alert.rule}"
    lines = [f"{keyword + ' ' if keyword else ''}{alert.headline()}"]
    if alert.values:
        lines.append(f"numbers: {_numbers(alert)}")
    lines.append(f"next: {alert.next_step}")
    lines.append(f"rule source: {alert.source}")
    md = [f"### {title}", f"**{alert.headline()}**"]
    if alert.values:
        md.append(f"> {_numbers(alert)}")
    md.append(f"next: {alert.next_step}")
    if alert.detail:
        lines.append(alert.detail)
        md.append("```\n" + alert.detail + "\n```")
    return Message(title, "\n".join(lines), "\n\n".join(md), alert.severity, 1)


def render(alerts: Sequence[Alert], keyword: str = "", dropped: int = 0) -> Message:
    """One alert in full, or several folded: counts per rule, the worst and the latest.

    ``dropped`` counts alerts lost before they reached the sink (a full queue), so the
    summary still says they happened.
    """
    if len(alerts) == 1 and not dropped:
        return _one(alerts[0], keyword)
    worst = max(alerts, key=lambda a: severity_rank(a.severity))
    latest = alerts[-1]
    per_rule = Counter(a.rule for a in alerts)
    counts = ", ".join(f"{rule} x{n}" for rule, n in per_rule.most_common())
    ranks = sorted({a.rank for a in alerts if a.rank is not None})
    steps = [a.step for a in alerts if a.step is not None]
    head = (f"{keyword + ' ' if keyword else ''}stepscope: {len(alerts) + dropped} alerts "
            f"folded into one message (rate limit) from {latest.run or 'run'}: {counts}")
    if dropped:
        head += f", {dropped} more dropped (queue full)"
    lines = [head]
    if ranks:
        lines.append(f"ranks: {', '.join(map(str, ranks[:16]))}"
                     + (f" (+{len(ranks) - 16} more)" if len(ranks) > 16 else ""))
    if steps:
        lines.append(f"steps: {min(steps)}..{max(steps)}")
    lines.append(f"worst: {worst.headline()}")
    if latest is not worst:
        lines.append(f"latest: {latest.headline()}")
    lines.append(f"next: {worst.next_step}")
    title = f"{keyword + ' ' if keyword else ''}stepscope: {len(alerts) + dropped} alerts"
    md = "\n\n".join([f"### {title}", *lines[1:], f"**{head}**"])
    return Message(title, "\n".join(lines), md, worst.severity, len(alerts) + dropped)
