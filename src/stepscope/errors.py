"""Errors a user can act on.

Every exception that reaches a user derives from :class:`StepscopeError`. Its message says
what was expected, what was found and what to do; the CLI prints it as one line (no
traceback) and exits non-zero. Anything else escaping the CLI is a bug in stepscope.
"""

from __future__ import annotations

__all__ = [
    "StepscopeError",
    "RunDirError",
    "TraceFormatError",
    "UnknownDeviceError",
    "ConfigError",
]


class StepscopeError(Exception):
    """Base class of every error stepscope raises on bad input."""

    exit_code = 2


class RunDirError(StepscopeError):
    """A path is missing, is not a run directory, or its run.json is unreadable."""


class TraceFormatError(StepscopeError):
    """A profiler trace could not be read: names the file and what was expected."""


class UnknownDeviceError(StepscopeError):
    """A device name has no peak FLOP/s entry; the message lists close names."""


class ConfigError(StepscopeError):
    """Inconsistent or impossible arguments (e.g. TP not dividing the head count)."""
