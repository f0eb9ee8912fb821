"""HTTP POST with a hard timeout, for the sender thread only (never the training thread).

urllib from the standard library: one request at a time from one thread needs no client
library, and the core keeps its dependencies few. Errors come back as values, never raised.
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field

from .platforms import HttpRequest

__all__ = ["HttpAnswer", "post"]


@dataclass(frozen=True)
class HttpAnswer:
    status: int | None  # None: no HTTP answer at all (refused, timed out, bad host)
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    error: str = ""


def post(req: HttpRequest, timeout_s: float) -> HttpAnswer:
    """POST ``req``; the answer (or why there was none), reading at most 64 KiB of body."""
    r = urllib.request.Request(req.url, data=req.body, headers=dict(req.headers),
                               method="POST")
    try:
        with urllib.request.urlopen(r, timeout=timeout_s) as resp:
            return HttpAnswer(resp.status, resp.read(65536), dict(resp.headers.items()))
    except urllib.error.HTTPError as exc:
        try:
            body = exc.read(65536)
        except OSError:
            body = b""
        return HttpAnswer(exc.code, body, dict(exc.headers.items()) if exc.headers else {})
    except urllib.error.URLError as exc:
        return HttpAnswer(None, error=str(exc.reason))
    except TimeoutError:
        return HttpAnswer(None, error=f"timed out after {timeout_s:g} s")
    except (OSError, ValueError, http.client.HTTPException) as exc:  # reset, bad URL
        return HttpAnswer(None, error=f"{type(exc).__name__}: {exc}")
