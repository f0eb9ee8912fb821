"""CLI commands of this area (registered on the `cli` group on import)."""

from __future__ import annotations

from . import cli  # noqa: F401
