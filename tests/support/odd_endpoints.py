"""Local endpoints that answer the way a misconfigured or hostile webhook does.

* :class:`OddAnswers`: ``POST /redirect/302`` and ``/redirect/307`` answer with that status
  and ``Location: /target``; ``/target`` answers any method with ``200 {"errcode": 0}``
  and records the method (a GET there is the lost alert urllib used to call delivered);
  ``/errcode/N`` answers ``200 {"errcode": N}``.
* :class:`SlowDrip`: the first request gets a status line and then one byte every
  ``drip_s`` (in the headers or in the body), until the client goes or ``drip_for_s`` ends;
  every later request is answered at once with ``200 {"ok": true}`` and recorded.

Both listen on 127.0.0.1 (a free port), in daemon threads.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _OddHandler(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, bytes]]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))

    def _answer(self, status: int, doc: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _any(self) -> None:
        body = self._body()
        self.seen.append((self.command, self.path, body))
        parts = self.path.strip("/").split("/")
        if parts[0] == "redirect":
            self._answer(int(parts[1]), {"moved": True}, {"Location": "/target"})
        elif parts[0] == "errcode":
            self._answer(200, {"errcode": int(parts[1]), "errmsg": "invalid corpid"})
        else:
            self._answer(200, {"errcode": 0, "errmsg": "ok"})

    do_GET = do_POST = do_PUT = _any


class OddAnswers:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bytes]] = []  # (method, path, body) per request
        handler = type("Handler", (_OddHandler,), {"seen": self.seen})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class SlowDrip:
    def __init__(self, where: str = "headers", drip_s: float = 2.0,
                 drip_for_s: float = 40.0) -> None:
        self.where, self.drip_s, self.drip_for_s = where, drip_s, drip_for_s
        self.received: list[bytes] = []  # request bodies answered at once
        self.drip_ended_s: float | None = None  # when the dripped client went away
        self._srv = socket.create_server(("127.0.0.1", 0))
        self._conns: list[socket.socket] = []
        self._first = True
        self.url = f"http://127.0.0.1:{self._srv.getsockname()[1]}/hook"
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                conn, _ = self._srv.accept()
            except OSError:
                return
            self._conns.append(conn)
            first, self._first = self._first, False
            threading.Thread(target=self._drip if first else self._quick, args=(conn,),
                             daemon=True).start()

    @staticmethod
    def _read_request(conn: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return b""
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        return body

    def _drip(self, conn: socket.socket) -> None:
        try:
            self._read_request(conn)
            if self.where == "headers":
                conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            else:
                conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{"ok": ')
            end = time.monotonic() + self.drip_for_s
            while time.monotonic() < end:
                time.sleep(self.drip_s)
                conn.sendall(b"a")
        except OSError:
            pass
        finally:
            self.drip_ended_s = time.monotonic()
            conn.close()

    def _quick(self, conn: socket.socket) -> None:
        try:
            self.received.append(self._read_request(conn))
            data = b'{"ok": true}'
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(data), data))
        except OSError:
            pass
        finally:
            conn.close()

    def stop(self) -> None:
        self._srv.close()
        for c in self._conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()
