"""Chat-robot platforms: each one's JSON schema, signature, limits and answer codes.

One :class:`Platform` entry per sink type, each limit with its source. ``build`` turns a
rendered :class:`Message` into the HTTP request the platform documents; ``interpret``
turns its answer into an :class:`Outcome` (accepted, retry later, or rejected for good).

Signatures, as each platform documents them:

* DingTalk robot ("加签"): ``sign = urlencode(base64(HmacSHA256(key=secret,
  msg=timestamp + "\\n" + secret)))`` with ``timestamp`` in milliseconds, appended to the
  URL as ``&timestamp=..&sign=..``; the robot rejects a timestamp more than an hour off.
* Feishu/Lark custom bot: ``sign = base64(HmacSHA256(key=timestamp + "\\n" + secret,
  msg=b""))`` with ``timestamp`` in *seconds*, both sent as strings in the JSON body.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from .config import SinkConfig
from .message import Message, truncate_utf8

__all__ = ["Platform", "PLATFORMS", "HttpRequest", "Outcome", "build", "interpret",
           "dingtalk_sign", "feishu_sign"]


@dataclass(frozen=True)
class Platform:
    name: str
    # (messages, seconds): at most that many in any window of that length.
    windows: tuple[tuple[int, float], ...]
    text_limit_bytes: int
    markdown_limit_bytes: int
    body_limit_bytes: int | None
    # How long the robot refuses messages after one over the limit, in seconds.
    throttled_for_s: float


PLATFORMS: dict[str, Platform] = {
    # WeCom group robot doc (developer.work.weixin.qq.com/document/path/91770): "每个机器人
    # 发送的消息不能超过20条/分钟"; text content <= 2048 bytes, markdown <= 4096 bytes (UTF-8).
    # Over the limit: errcode 45009, and the window is a minute.
    "wecom": Platform("wecom", ((20, 60.0),), 2048, 4096, None, 60.0),
    # DingTalk custom robot doc (open.dingtalk.com, "自定义机器人发送群消息"): 20 messages per
    # minute; going over throttles the robot for 10 minutes (errcode 130101, "send too
    # fast"). No byte limit is documented for content; stepscope keeps WeCom's 4096 so a
    # message reads the same on every platform.
    "dingtalk": Platform("dingtalk", ((20, 60.0),), 4096, 4096, None, 600.0),
    # Feishu custom bot doc (open.feishu.cn, "自定义机器人使用指南"): 100 per minute and 5 per
    # second per bot; request body <= 20 KB; over the limit answers code 11232.
    "feishu": Platform("feishu", ((100, 60.0), (5, 1.0)), 19000, 19000, 20 * 1024, 60.0),
    # Slack incoming webhooks (api.slack.com/apis/rate-limits): 1 message per second, short
    # bursts allowed; over it answers HTTP 429 with Retry-After. Text is truncated by Slack
    # past 40,000 characters; 4096 bytes keeps messages readable.
    "slack": Platform("slack", ((1, 1.0),), 4096, 4096, None, 1.0),
    # A generic JSON webhook has no documented limit: one per second keeps a receiver that
    # was never meant for bursts (a script, a pager gateway) from being flooded.
    "webhook": Platform("webhook", ((1, 1.0),), 16384, 16384, None, 1.0),
    # The console: one red line; a line per 10 s at most so a storm does not bury the
    # training script's own output.
    "console": Platform("console", ((1, 10.0),), 1000, 1000, None, 10.0),
}


@dataclass(frozen=True)
class HttpRequest:
    url: str
    body: bytes
    headers: Mapping[str, str]


@dataclass(frozen=True)
class Outcome:
    """``status``: accepted | retry | rejected | throttled (retry after the platform's wait)."""

    status: str
    detail: str
    retry_after_s: float | None = None

    @property
    def accepted(self) -> bool:
        return self.status == "accepted"


def dingtalk_sign(timestamp_ms: int, secret: str) -> str:
    """DingTalk's signature, base64 (not yet URL-encoded)."""
    msg = f"{timestamp_ms}\n{secret}".encode()
    return base64.b64encode(hmac.new(secret.encode(), msg, hashlib.sha256).digest()).decode()


def feishu_sign(timestamp_s: int, secret: str) -> str:
    """Feishu's signature: the key is ``timestamp + "\\n" + secret``, the message empty."""
    key = f"{timestamp_s}\n{secret}".encode()
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()


def _split_mentions(mention: tuple[str, ...]) -> tuple[list[str], list[str], bool]:
    """(user ids, mobile numbers, everyone?) from the sink's ``mention`` list."""
    everyone = any(m in ("@all", "all") for m in mention)
    rest = [m for m in mention if m not in ("@all", "all")]
    mobiles = [m for m in rest if m.lstrip("+").isdigit()]
    return [m for m in rest if m not in mobiles], mobiles, everyone


def _wecom(sink: SinkConfig, msg: Message, plat: Platform) -> dict[str, Any]:
    users, mobiles, everyone = _split_mentions(sink.mention)
    if sink.msgtype == "markdown":
        content = msg.markdown + "".join(f"\n<@{u}>" for u in users)
        return {"msgtype": "markdown",
                "markdown": {"content": truncate_utf8(content, plat.markdown_limit_bytes)}}
    return {"msgtype": "text", "text": {
        "content": truncate_utf8(msg.text, plat.text_limit_bytes),
        "mentioned_list": users + (["@all"] if everyone else []),
        "mentioned_mobile_list": mobiles}}


def _dingtalk(sink: SinkConfig, msg: Message, plat: Platform) -> dict[str, Any]:
    users, mobiles, everyone = _split_mentions(sink.mention)
    at = {"atMobiles": mobiles, "atUserIds": users, "isAtAll": everyone}
    # DingTalk shows an @ only when the number also appears in the text.
    tail = "".join(f" @{m}" for m in mobiles)
    if sink.msgtype == "markdown":
        text = truncate_utf8(msg.markdown + tail, plat.markdown_limit_bytes)
        return {"msgtype": "markdown", "markdown": {"title": msg.title, "text": text}, "at": at}
    return {"msgtype": "text",
            "text": {"content": truncate_utf8(msg.text + tail, plat.text_limit_bytes)}, "at": at}


def _feishu(sink: SinkConfig, msg: Message, plat: Platform) -> dict[str, Any]:
    users, _, everyone = _split_mentions(sink.mention)
    ats = [f'<at user_id="{u}"></at>' for u in users] + (['<at user_id="all"></at>']
                                                        if everyone else [])
    text = truncate_utf8(msg.text, plat.text_limit_bytes) + "".join(" " + a for a in ats)
    return {"msg_type": "text", "content": {"text": text}}


def _slack(sink: SinkConfig, msg: Message, plat: Platform) -> dict[str, Any]:
    ats = ["<!channel>" if m in ("@all", "all") else f"<@{m}>" for m in sink.mention]
    return {"text": truncate_utf8(msg.text, plat.text_limit_bytes) + "".join(" " + a for a in ats)}


def build(sink: SinkConfig, msg: Message, payload: list[dict[str, Any]], now_s: float,
          ) -> HttpRequest:
    """The request for ``sink``; ``payload`` (alert dicts) goes only to the generic webhook."""
    plat = PLATFORMS[sink.type]
    url = sink.url
    body: dict[str, Any]
    if sink.type == "wecom":
        body = _wecom(sink, msg, plat)
    elif sink.type == "dingtalk":
        body = _dingtalk(sink, msg, plat)
        if sink.secret:
            ts_ms = int(now_s * 1000)
            sign = urllib.parse.quote_plus(dingtalk_sign(ts_ms, sink.secret))
            url += f"{'&' if '?' in url else '?'}timestamp={ts_ms}&sign={sign}"
    elif sink.type == "feishu":
        body = _feishu(sink, msg, plat)
        if sink.secret:
            ts_s = int(now_s)
            body = {"timestamp": str(ts_s), "sign": feishu_sign(ts_s, sink.secret), **body}
    elif sink.type == "slack":
        body = _slack(sink, msg, plat)
    else:
        body = {"source": "stepscope", "title": msg.title, "text": msg.text,
                "severity": msg.severity, "count": msg.count, "alerts": payload}
    data = orjson.dumps(body)
    if plat.body_limit_bytes is not None and len(data) > plat.body_limit_bytes:
        # Only Feishu has a body limit; its text was cut to fit, so this is a last guard.
        data = orjson.dumps({**body, "content": {"text": truncate_utf8(msg.title, 1000)}})
    return HttpRequest(url, data, {"Content-Type": "application/json; charset=utf-8"})


def interpret(sink_type: str, status: int | None, body: bytes, headers: Mapping[str, str],
              error: str) -> Outcome:
    """What the platform's answer means: HTTP status first, then its JSON error code.

    Accepted only on the platform's own success answer: a 2xx, and for the chat robots a
    JSON object whose error code is the integer 0. A 3xx is a failure (the POST was not
    redirected, so nothing was delivered), and so is a 1xx or any other non-2xx.
    """
    plat = PLATFORMS[sink_type]
    if status is None:
        return Outcome("retry", f"no answer ({error})")
    snippet = body[:200].decode("utf-8", errors="replace")
    if status == 429:
        return Outcome("throttled", f"HTTP 429 {snippet}".strip(), _retry_after(headers))
    if status >= 500:
        return Outcome("retry", f"HTTP {status} {snippet}".strip())
    if 300 <= status < 400:
        return Outcome("rejected", f"HTTP {status} redirect not followed (a POST is never "
                                   "redirected): point the sink at the final URL")
    if not 200 <= status < 300:
        return Outcome("rejected", f"HTTP {status} {snippet}".strip())
    if sink_type == "slack":
        return Outcome("accepted", f"HTTP {status}")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    if sink_type == "webhook":
        return _webhook_answer(status, doc, snippet)
    if not isinstance(doc, dict):
        return Outcome("rejected", f"HTTP {status}, answer is not a JSON object: {snippet}")
    code, text = _error_code(doc)
    # bool is an int in Python: ``false == 0`` must not read as success.
    if type(code) is int and code == 0:
        return Outcome("accepted", f"HTTP {status}, code 0")
    # WeCom 45009, DingTalk 130101, Feishu 11232: over the platform's rate limit.
    if code in (45009, 130101, 11232):
        return Outcome("throttled", f"code {code} {text}", plat.throttled_for_s)
    return Outcome("rejected", f"code {code} {text}")


def _error_code(doc: Mapping[str, Any]) -> tuple[Any, Any]:
    """The robot's error code and message: WeCom/DingTalk ``errcode``/``errmsg``; Feishu
    ``code``/``msg`` (v2 hooks) or ``StatusCode``/``StatusMessage`` (older answers). A
    non-zero one anywhere wins over a zero elsewhere."""
    pairs = [(doc[c], doc.get(m, "")) for c, m in (
        ("errcode", "errmsg"), ("code", "msg"), ("StatusCode", "StatusMessage")) if c in doc]
    bad = [p for p in pairs if not (type(p[0]) is int and p[0] == 0)]
    return (bad or pairs or [(None, "")])[0]


def _webhook_answer(status: int, doc: Any, snippet: str) -> Outcome:
    # A generic webhook may answer anything; a 2xx is success unless the answer carries a
    # WeCom/DingTalk-style ``errcode`` (a gateway relaying to a robot) that is not 0.
    # ``code`` is not read here: many services answer ``{"code": 200}`` on success.
    if isinstance(doc, dict) and "errcode" in doc:
        code = doc["errcode"]
        if not (type(code) is int and code == 0):
            return Outcome("rejected", f"HTTP {status}, errcode {code} {doc.get('errmsg', '')}"
                           .strip())
    return Outcome("accepted", f"HTTP {status}")


def _retry_after(headers: Mapping[str, str]) -> float | None:
    for k, v in headers.items():
        if k.lower() == "retry-after":
            try:
                return max(0.0, float(v))
            except ValueError:
                return None
    return None
