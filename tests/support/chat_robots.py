"""A real local HTTP server that plays WeCom, DingTalk, Feishu, Slack and a plain webhook.

Each endpoint checks what the platform's documentation says it checks, independently of
stepscope's code (signatures recomputed here from the documented recipe, limits counted
here with their own sliding windows), and answers the way the platform answers:

* WeCom ``POST /wecom/cgi-bin/webhook/send?key=K``: ``msgtype`` text (content <= 2048
  bytes) or markdown (<= 4096 bytes); 20 per minute, over it errcode 45009.
* DingTalk ``POST /dingtalk/robot/send?access_token=T&timestamp=MS&sign=S``: sign =
  base64(HmacSHA256(secret, MS + "\\n" + secret)), URL-encoded, MS within an hour of now;
  the keyword must appear in the message; 20 per minute, and one over it throttles the
  robot for 10 minutes (errcode 130101 for everything in that time).
* Feishu ``POST /feishu/open-apis/bot/v2/hook/H``: ``timestamp`` (seconds) and ``sign`` =
  base64(HmacSHA256(key=timestamp + "\\n" + secret, msg="")) in the body, body <= 20 KB;
  100 per minute and 5 per second, over it code 11232.
* Slack ``POST /slack/services/X``: ``{"text": ...}``; 1 per second, over it HTTP 429 with
  ``Retry-After``.
* Webhook ``POST /webhook``: any JSON object with an ``alerts`` list.

``mode`` makes every endpoint slow (``delay_s``), failing (HTTP 500) or normal; stopping
the server makes it absent (connection refused on its port).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import socket
import threading
import time
import urllib.parse
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

WECOM_KEY = "wecom-key-0001"
DING_TOKEN = "ding-token-0001"
DING_SECRET = "SECding-secret-0001"
FEISHU_HOOK = "feishu-hook-0001"
FEISHU_SECRET = "feishu-secret-0001"
SLACK_PATH = "T000/B000/XXXX"


@dataclass
class Received:
    platform: str
    body: dict[str, Any]
    time_s: float


@dataclass
class RobotState:
    keyword: str = "stepscope"
    mode: str = "ok"  # ok | slow | fail
    delay_s: float = 0.0
    # (count, seconds) per platform; tests may scale the window, never the count check.
    limits: dict[str, list[tuple[int, float]]] = field(default_factory=lambda: {
        "wecom": [(20, 60.0)], "dingtalk": [(20, 60.0)],
        "feishu": [(100, 60.0), (5, 1.0)], "slack": [(1, 1.0)], "webhook": []})
    ding_throttle_s: float = 600.0
    accepted: list[Received] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (platform, why)
    times: dict[str, deque[float]] = field(default_factory=dict)
    ding_throttled_until: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def texts(self, platform: str) -> list[str]:
        with self.lock:
            return [_text(r) for r in self.accepted if r.platform == platform]

    def retry_after_s(self, platform: str, now: float) -> int:
        """Whole seconds until the oldest request in the window leaves it (as Slack says)."""
        count, window = self.limits[platform][0]
        inside = sorted(t for t in self.times[platform] if now - t < window)
        return max(1, math.ceil(inside[-count] + window - now)) if len(inside) >= count else 1

    def over_limit(self, platform: str, now: float, count_refused: bool = True) -> bool:
        """Counts every request (the chat robots count refused ones too), then checks each
        window; ``count_refused=False`` counts only the requests let through."""
        q = self.times.setdefault(platform, deque())
        q.append(now)
        for count, window in self.limits[platform]:
            if sum(1 for t in q if now - t < window) > count:
                if not count_refused:
                    q.pop()
                return True
        return False


def _text(r: Received) -> str:
    b = r.body
    if r.platform == "wecom":
        return str(b[b["msgtype"]]["content"])
    if r.platform == "dingtalk":
        return str(b["text"]["content"] if b["msgtype"] == "text" else b["markdown"]["text"])
    if r.platform == "feishu":
        return str(b["content"]["text"])
    return str(b.get("text", ""))


def _sign_ok_ding(ts: str, sign: str, now: float) -> bool:
    msg = f"{ts}\n{DING_SECRET}".encode()
    want = base64.b64encode(hmac.new(DING_SECRET.encode(), msg, hashlib.sha256).digest())
    return ts.isdigit() and abs(now * 1000 - int(ts)) < 3_600_000 and sign == want.decode()


def _sign_ok_feishu(ts: Any, sign: Any, now: float) -> bool:
    if not isinstance(ts, str) or not ts.isdigit() or not isinstance(sign, str):
        return False
    key = f"{ts}\n{FEISHU_SECRET}".encode()
    want = base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()
    return abs(now - int(ts)) < 3600 and sign == want


class _Handler(BaseHTTPRequestHandler):
    state: RobotState

    def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
        pass

    def _answer(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        st = self.state
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if st.mode == "slow":
            time.sleep(st.delay_s)
        if st.mode == "fail":
            self._answer(500, "internal error")
            return
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        try:
            body = json.loads(raw)
        except ValueError:
            self._answer(400, {"errcode": 40001, "errmsg": "invalid json"})
            return
        platform = url.path.split("/")[1]
        handler = getattr(self, f"_{platform}", None)
        if handler is None or not isinstance(body, dict):
            self._answer(404, "no such robot")
            return
        with st.lock:
            handler(url.path, query, body, raw, time.time())

    def _refuse(self, platform: str, why: str, status: int, body: Any,
                headers: dict[str, str] | None = None) -> None:
        self.state.refused.append((platform, why))
        self._answer(status, body, headers)

    def _accept(self, platform: str, body: dict[str, Any], now: float, answer: Any) -> None:
        self.state.accepted.append(Received(platform, body, now))
        self._answer(200, answer)

    def _wecom(self, path: str, q: dict[str, list[str]], body: dict[str, Any], raw: bytes,
               now: float) -> None:
        if path != "/wecom/cgi-bin/webhook/send" or q.get("key") != [WECOM_KEY]:
            return self._refuse("wecom", "bad key", 200, {"errcode": 93000,
                                                          "errmsg": "invalid webhook url"})
        kind = body.get("msgtype")
        limit = {"text": 2048, "markdown": 4096}.get(str(kind))
        content = body.get(str(kind), {}).get("content") if limit else None
        if limit is None or not isinstance(content, str) or not content:
            return self._refuse("wecom", "schema", 200, {"errcode": 40008,
                                                         "errmsg": "invalid message type"})
        if len(content.encode()) > limit:
            return self._refuse("wecom", "too long", 200, {"errcode": 40058,
                                                           "errmsg": "content exceed max length"})
        if self.state.over_limit("wecom", now):
            return self._refuse("wecom", "rate", 200, {"errcode": 45009,
                                                       "errmsg": "api freq out of limit"})
        self._accept("wecom", body, now, {"errcode": 0, "errmsg": "ok"})

    def _dingtalk(self, path: str, q: dict[str, list[str]], body: dict[str, Any], raw: bytes,
                  now: float) -> None:
        st = self.state
        if path != "/dingtalk/robot/send" or q.get("access_token") != [DING_TOKEN]:
            return self._refuse("dingtalk", "token", 200, {"errcode": 300001,
                                                           "errmsg": "token is not exist"})
        if not _sign_ok_ding(q.get("timestamp", [""])[0], q.get("sign", [""])[0], now):
            return self._refuse("dingtalk", "sign", 200, {"errcode": 310000,
                                                          "errmsg": "sign not match"})
        kind = body.get("msgtype")
        inner = body.get(str(kind))
        text = (inner or {}).get("content" if kind == "text" else "text")
        if kind not in ("text", "markdown") or not isinstance(text, str) or (
                kind == "markdown" and not isinstance(inner.get("title"), str)):
            return self._refuse("dingtalk", "schema", 200, {"errcode": 40035,
                                                            "errmsg": "缺少参数 json"})
        if st.keyword not in text:
            return self._refuse("dingtalk", "keyword", 200, {"errcode": 310000,
                                                             "errmsg": "keywords not in content"})
        if now < st.ding_throttled_until or st.over_limit("dingtalk", now):
            if now >= st.ding_throttled_until:
                st.ding_throttled_until = now + st.ding_throttle_s
            return self._refuse("dingtalk", "rate", 200, {
                "errcode": 130101, "errmsg": "send too fast, exceed 20 times per minute"})
        self._accept("dingtalk", body, now, {"errcode": 0, "errmsg": "ok"})

    def _feishu(self, path: str, q: dict[str, list[str]], body: dict[str, Any], raw: bytes,
                now: float) -> None:
        if path != f"/feishu/open-apis/bot/v2/hook/{FEISHU_HOOK}":
            return self._refuse("feishu", "hook", 404, {"code": 19001, "msg": "param invalid"})
        if len(raw) > 20 * 1024:
            return self._refuse("feishu", "size", 200, {"code": 9499, "msg": "body too large"})
        if not _sign_ok_feishu(body.get("timestamp"), body.get("sign"), now):
            return self._refuse("feishu", "sign", 200, {"code": 19021,
                                                        "msg": "sign match fail"})
        content = body.get("content")
        if body.get("msg_type") != "text" or not isinstance(content, dict) or not isinstance(
                content.get("text"), str):
            return self._refuse("feishu", "schema", 200, {"code": 9499, "msg": "Bad Request"})
        if self.state.over_limit("feishu", now):
            return self._refuse("feishu", "rate", 200, {"code": 11232,
                                                        "msg": "frequency limited"})
        self._accept("feishu", body, now, {"code": 0, "msg": "success", "data": {}})

    def _slack(self, path: str, q: dict[str, list[str]], body: dict[str, Any], raw: bytes,
               now: float) -> None:
        if path != f"/slack/services/{SLACK_PATH}":
            return self._refuse("slack", "hook", 404, "no_service")
        if not isinstance(body.get("text"), str) or not body["text"]:
            return self._refuse("slack", "schema", 400, "invalid_payload")
        if self.state.over_limit("slack", now, count_refused=False):
            return self._refuse("slack", "rate", 429, "rate_limited",
                                {"Retry-After": str(self.state.retry_after_s("slack", now))})
        self._accept("slack", body, now, "ok")

    def _webhook(self, path: str, q: dict[str, list[str]], body: dict[str, Any], raw: bytes,
                 now: float) -> None:
        if not isinstance(body.get("alerts"), list):
            return self._refuse("webhook", "schema", 400, "expected alerts")
        self._accept("webhook", body, now, {"ok": True})


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that timed out on a slow robot closes first: expected here


class ChatRobots:
    """The server on 127.0.0.1 (a free port), in a thread; ``url(platform)`` per robot."""

    def __init__(self) -> None:
        self.state = RobotState()
        handler = type("Handler", (_Handler,), {"state": self.state})
        self._server = _Server(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, platform: str) -> str:
        base = f"http://127.0.0.1:{self.port}"
        return {
            "wecom": f"{base}/wecom/cgi-bin/webhook/send?key={WECOM_KEY}",
            "dingtalk": f"{base}/dingtalk/robot/send?access_token={DING_TOKEN}",
            "feishu": f"{base}/feishu/open-apis/bot/v2/hook/{FEISHU_HOOK}",
            "slack": f"{base}/slack/services/{SLACK_PATH}",
            "webhook": f"{base}/webhook",
        }[platform]

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class BlackHole:
    """A local endpoint that accepts every connection and never answers (the worst
    endpoint: every request runs into its timeout). ``url`` posts to it."""

    def __init__(self) -> None:
        self._srv = socket.create_server(("127.0.0.1", 0), backlog=64)
        self._held: list[socket.socket] = []
        self.url = f"http://127.0.0.1:{self._srv.getsockname()[1]}/hook"
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                conn, _ = self._srv.accept()
            except OSError:
                return
            self._held.append(conn)  # never read, never answered, never closed

    def stop(self) -> None:
        self._srv.close()
        for c in self._held:
            c.close()
