"""HTTP POST with a hard total deadline, for the sender thread only (never the training thread).

urllib from the standard library: one request at a time from one thread needs no client
library, and the core keeps its dependencies few. Errors come back as values, never raised.

Two things urllib does by default are wrong for a webhook, so the opener here changes them:

* Redirects: urllib follows 301/302/303 by re-sending a POST as a GET *without its body*,
  so a robot that moved answered the GET and the alert was recorded as delivered while
  nobody saw it. A POST is never redirected here; the 3xx comes back as the answer.
* Time: urllib's ``timeout`` bounds each socket operation, not the request. An endpoint
  that sends one byte every few seconds holds the (single) sender thread for as long as it
  likes, and every later alert of the run waits behind it. A timer shuts the socket down
  at the deadline, wherever the request is (connect, headers, body).
"""

from __future__ import annotations

import http.client
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.message import Message
from typing import IO, Any

from .platforms import HttpRequest

__all__ = ["HttpAnswer", "post"]

# The most body read from an answer: the platforms' answers are a few hundred bytes.
_MAX_BODY_BYTES = 65536


@dataclass(frozen=True)
class HttpAnswer:
    status: int | None  # None: no HTTP answer at all (refused, timed out, bad host)
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    error: str = ""


class _Deadline:
    """Shuts down every socket of one request once its time is up (from a timer thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self.expired = False

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._socks.append(sock)
            if not self.expired:
                return
        _shut(sock)  # connected after the deadline: end it at once

    def expire(self) -> None:
        with self._lock:
            self.expired = True
            socks = list(self._socks)
        for s in socks:
            _shut(s)


def _shut(sock: socket.socket) -> None:
    # shutdown, not close: a recv blocked in another thread returns at once on shutdown.
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed or never connected


def _opener(deadline: _Deadline) -> urllib.request.OpenerDirector:
    def conn_class(base: type[http.client.HTTPConnection]) -> Any:
        class Conn(base):  # type: ignore[valid-type,misc]
            def connect(self) -> None:
                super().connect()
                deadline.watch(self.sock)
        return Conn

    http_conn = conn_class(http.client.HTTPConnection)
    https_conn = conn_class(http.client.HTTPSConnection)

    class Http(urllib.request.HTTPHandler):
        def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(http_conn, req)

    class Https(urllib.request.HTTPSHandler):
        def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(https_conn, req)

    return urllib.request.build_opener(Http, Https, _NoRedirect)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Never follow a redirect: the 3xx is raised as an HTTPError (an answer, a failure)."""

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int,
                         msg: str, headers: Message, newurl: str) -> None:
        return None


def post(req: HttpRequest, timeout_s: float) -> HttpAnswer:
    """POST ``req``; the answer (or why there was none) within ``timeout_s`` in total,
    reading at most 64 KiB of body. Redirects are not followed (see the module docstring)."""
    deadline = _Deadline()
    timer = threading.Timer(timeout_s, deadline.expire)
    timer.daemon = True
    timer.start()
    try:
        answer = _post(_opener(deadline), req, timeout_s)
    finally:
        timer.cancel()
    if deadline.expired:  # whatever was read, the answer is cut short
        # The same words as a socket timeout: which of the two fired first is a race.
        return HttpAnswer(None, error=f"timed out after {timeout_s:g} s")
    return answer


def _post(opener: urllib.request.OpenerDirector, req: HttpRequest,
          timeout_s: float) -> HttpAnswer:
    r = urllib.request.Request(req.url, data=req.body, headers=dict(req.headers),
                               method="POST")
    try:
        with opener.open(r, timeout=timeout_s) as resp:
            return HttpAnswer(resp.status, resp.read(_MAX_BODY_BYTES),
                              dict(resp.headers.items()))
    except urllib.error.HTTPError as exc:
        try:
            body = exc.read(_MAX_BODY_BYTES)
        except OSError:
            body = b""
        return HttpAnswer(exc.code, body, dict(exc.headers.items()) if exc.headers else {})
    except urllib.error.URLError as exc:
        return HttpAnswer(None, error=str(exc.reason))
    except TimeoutError:
        return HttpAnswer(None, error=f"timed out after {timeout_s:g} s")
    except (OSError, ValueError, http.client.HTTPException) as exc:  # reset, bad URL
        return HttpAnswer(None, error=f"{type(exc).__name__}: {exc}")
