"""Step ranges written ``a:b``: the one parser and the one convention of every such flag.

``FIRST:LAST`` names step numbers with **both ends included**: ``10:12`` is steps 10, 11
and 12, ``7`` is step 7 alone, and an empty side is open (``3:`` from step 3 on, ``:5``
up to step 5). Step numbers are what the user reads in a trace (``ProfilerStep#10`` ..
``#12``) and in a step table, so a range names exactly the steps it shows; MindSpore's
``profile_steps=(first, last)`` already counts this way. Used by ``stepscope trace
--steps`` and ``stepscope run --profile-steps`` (and its ``STEPSCOPE_PROFILE_STEPS``).

Pure and framework-free: the integrations import it inside training processes.

Example::

    parse_step_range("10:12")                       # StepRange(first=10, last=12)
    parse_step_range("3:", "--steps")               # StepRange(first=3, last=None)
    parse_step_range("5:8", closed=True).last       # 8
"""

from __future__ import annotations

from typing import NamedTuple

from .errors import ConfigError

__all__ = ["StepRange", "StepRangeError", "parse_step_range"]


class StepRange(NamedTuple):
    """Steps ``first`` .. ``last``, both included; None is an open end."""

    first: int | None
    last: int | None

    def __contains__(self, step: object) -> bool:
        if not isinstance(step, int):
            return False
        return ((self.first is None or step >= self.first)
                and (self.last is None or step <= self.last))


class StepRangeError(ConfigError, ValueError):
    """A malformed ``a:b`` (a ConfigError for the CLI, a ValueError for older callers)."""


_EXPECTED = "expected 'a:b', step numbers with both ends included (e.g. 2:4, 3: or :5)"


def _int(text: str, spec: str, prefix: str) -> int | None:
    text = text.strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise StepRangeError(f"{prefix}{spec!r}: {_EXPECTED}; {text!r} is not a step number"
                             ) from None


def parse_step_range(spec: str | None, flag: str = "", *, closed: bool = False
                     ) -> StepRange | None:
    """``"a:b"`` -> ``StepRange(a, b)``, both included; ``"a"`` -> ``StepRange(a, a)``.

    None or blank -> None. ``closed``: both ends are required and ``0 <= a``. ``flag``
    names the option in error messages. Raises :class:`StepRangeError`.
    """
    if spec is None or not spec.strip():
        return None
    prefix = f"{flag} " if flag else ""
    parts = spec.split(":")
    if len(parts) > 2:
        raise StepRangeError(f"{prefix}{spec!r}: {_EXPECTED}")
    first = _int(parts[0], spec, prefix)
    last = first if len(parts) == 1 else _int(parts[1], spec, prefix)
    if closed and (first is None or last is None or first < 0):
        raise StepRangeError(f"{prefix}{spec!r}: {_EXPECTED}; both ends are needed here, "
                             "from step 0 on")
    if first is not None and last is not None and last < first:
        raise StepRangeError(f"{prefix}{spec!r}: {_EXPECTED}; {last} is before {first}")
    return StepRange(first, last)
