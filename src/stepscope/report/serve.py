"""`stepscope serve`: the local dashboard over a root of runs (HTTP only; data in serve_data).

A threaded stdlib HTTP server: it binds to 127.0.0.1 unless told otherwise, serves one
page (``assets/dashboard.html``) with its vendored scripts (uPlot, no CDN: it works on an
air-gapped cluster) and a small JSON API the page polls while a run is live:

    GET /api/runs?where=EXPR&where=EXPR&sort=-mfu&q=TEXT   run list (the index)
    GET /api/run?path=REL[&findings=0]                       sheet, findings, events, profile
    GET /api/findings?path=REL                               diagnose's findings
    GET /api/series?path=REL&max_points=N[&steps=A:B|A:]     per-step series for the charts
    GET /api/compare?a=REL&b=REL                             the A/B verdict

It answers only its owner: a request whose ``Host`` header names anything but a loopback
name (``localhost``, ``127.0.0.1``, ``[::1]``) or the address given with ``--host`` gets
421 (a web page that rebinds its own DNS name to 127.0.0.1 cannot read the runs), and every
request needs the per-server token of the URL it prints (``?token=...`` once, then a
cookie, as Jupyter does): another local user reaching 127.0.0.1 gets 403.

Example::

    server = make_server("runs", port=0)       # port 0: any free port
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(server.url)
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import sys
from http import HTTPStatus
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

from ..errors import StepscopeError
from .serve_data import Dashboard, NotFound
from .serve_partial import PARTIAL_BYTES, SAMPLE_BYTES

__all__ = ["make_server", "DashboardServer", "ASSETS"]

# name -> content type: the only files the server hands out.
ASSETS = {
    "dashboard.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "charts.js": "text/javascript; charset=utf-8",
    "views.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
}


# Every answer forbids loads from anywhere but this server (the page needs nothing else).
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
       "frame-ancestors 'none'; form-action 'none'")
_COOKIE = "stepscope_token"
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_WILDCARDS = ("", "0.0.0.0", "::")


def host_name(header: str) -> str:
    """The name of a Host header, port and IPv6 brackets off, lower case."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def _asset(name: str) -> bytes:
    return (resources.files("stepscope.report") / "assets" / name).read_bytes()


class DashboardServer(ThreadingHTTPServer):
    daemon_threads = True  # a hung browser connection never keeps the process alive

    def __init__(self, board: Dashboard, host: str, port: int, token: str | None) -> None:
        super().__init__((host, port), _Handler)
        self.board = board
        self.token = token  # required on every request when not None
        # Host headers answered: loopback names, and the address listened on unless it is
        # a wildcard (0.0.0.0: any name reaches it; the token still guards it).
        self.hosts: frozenset[str] | None = (
            None if host in _WILDCARDS else frozenset({*_LOOPBACK_NAMES, host.lower()}))

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A browser that closed its connection (a tab closed, a reload) is no error worth
        a traceback on the terminal; anything else is reported as usual."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else str(host)
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/" + (f"?token={self.token}" if self.token else "")


class _Handler(BaseHTTPRequestHandler):
    server: DashboardServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib name)
        pass  # one line per request would bury the URL the user needs; errors are answered

    def _send(self, status: int, body: bytes, ctype: str, cookie: str | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        if cookie:
            self.send_header("Set-Cookie", f"{_COOKIE}={cookie}; HttpOnly; SameSite=Strict; "
                                           "Path=/")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, doc: Any) -> None:
        body = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS,
                            default=str)
        self._send(status, body, "application/json")

    def _authorised(self, given: str | None) -> bool:
        want = self.server.token
        if want is None:
            return True
        jar = SimpleCookie(self.headers.get("Cookie", ""))
        cookie = jar[_COOKIE].value if _COOKIE in jar else ""
        return any(hmac.compare_digest(want, c) for c in (given or "", cookie) if c)

    def do_GET(self) -> None:  # noqa: N802 (stdlib name)
        url = urlsplit(self.path)
        q = parse_qs(url.query)
        one = {k: v[-1] for k, v in q.items()}
        hosts = self.server.hosts
        if hosts is not None and host_name(self.headers.get("Host", "")) not in hosts:
            self._json(421, {"error": "this dashboard answers only to its own address "
                                      "(localhost or the --host it was started with)"})
            return
        if not self._authorised(one.get("token")):
            self._json(403, {"error": "this dashboard needs its token: open the URL that "
                                      "`stepscope serve` printed"})
            return
        try:
            if url.path in ("/", "/index.html"):
                self._send(200, _asset("dashboard.html"), ASSETS["dashboard.html"],
                           cookie=self.server.token)
            elif url.path == "/favicon.ico":
                self._send(204, b"", "image/x-icon")
            elif url.path.startswith("/assets/") and url.path[8:] in ASSETS:
                name = url.path[8:]
                self._send(200, _asset(name), ASSETS[name])
            elif url.path == "/api/runs":
                self._json(200, self.server.board.runs(q.get("where", []), one.get("sort"),
                                                       one.get("q", "")))
            elif url.path == "/api/run":
                self._json(200, self.server.board.run(one.get("path", ""),
                                                      one.get("findings") != "0"))
            elif url.path == "/api/findings":
                self._json(200, self.server.board.findings(one.get("path", "")))
            elif url.path == "/api/series":
                points = max(100, min(int(one.get("max_points", 2000)), 20000))
                self._json(200, self.server.board.series(one.get("path", ""), points,
                                                         steps=_window(one.get("steps"))))
            elif url.path == "/api/compare":
                self._json(200, self.server.board.compare(one.get("a", ""), one.get("b", "")))
            else:
                self._json(404, {"error": f"no such page: {url.path}"})
        except NotFound as exc:
            self._json(404, {"error": str(exc)})
        except (StepscopeError, ValueError) as exc:
            self._json(400, {"error": str(exc)})
        except (BrokenPipeError, ConnectionResetError):
            pass  # the browser went away mid-answer
        except Exception as exc:  # a bad run must not take the dashboard down: say why
            self._json(HTTPStatus.INTERNAL_SERVER_ERROR,
                       {"error": f"{type(exc).__name__}: {exc}"})


def _window(text: str | None) -> tuple[int, int | None] | None:
    """``steps=FIRST:LAST`` (inclusive, the zoomed window; ``FIRST:`` runs to the newest
    step, a window that follows a live run) or None for the whole run."""
    if not text:
        return None
    lo, sep, hi = text.partition(":")
    if not sep:
        raise ValueError(f"steps={text!r}: expected FIRST:LAST or FIRST:")
    return int(lo), (int(hi) if hi.strip() else None)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def make_server(root: str, host: str = "127.0.0.1", port: int = 8765,
                refresh_s: float = 2.0, token: str | None = None,
                index_wait_s: float = 0.25, partial_bytes: int | None = PARTIAL_BYTES,
                sample_bytes: int = SAMPLE_BYTES) -> DashboardServer:
    """A ready (bound, not yet serving) dashboard server over ``root``, with a token
    (generated unless given) that every request must carry, and a Host check (see the
    module docstring); ``url`` is the address to open, token included.
    ``index_wait_s``: how long a request waits for the index before it answers with what
    is known (serve_index.RunList). ``partial_bytes``, ``sample_bytes``: a run with more
    step bytes than that to decode paints first from a sample of that many (serve_partial;
    None: never)."""
    board = Dashboard(root, refresh_s=refresh_s, index_wait_s=index_wait_s,
                      partial_bytes=partial_bytes, sample_bytes=sample_bytes)
    if token is None:  # on loopback too: any local user can reach 127.0.0.1
        token = secrets.token_urlsafe(18)
    try:
        return DashboardServer(board, host, port, token)
    except OSError as exc:
        raise StepscopeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; "
                             "pick another --port (0 = any free port)") from None
