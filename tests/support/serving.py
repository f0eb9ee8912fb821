"""The dashboard's printed URL (``http://HOST:PORT/?token=T``) and paths on its server."""

from __future__ import annotations


def at(printed: str, path: str = "") -> str:
    """``path`` (``api/runs?q=x``) on the server whose URL ``stepscope serve`` printed,
    carrying its token."""
    base, _, token = printed.partition("?")
    return base + path + (("&" if "?" in path else "?") + token if token else "")


def origin(printed: str) -> str:
    """The printed URL without its token: what every request of the page starts with."""
    return printed.partition("?")[0]
