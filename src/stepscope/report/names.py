"""Op names shortened for a column of a given width, never cut blindly.

Kernel and MindSpore op names run to hundreds of characters and share long prefixes
("Gradients/Default/network-WithLossCell/_backbone-GPT/..."): a plain right cut shows the
same prefix on every row. So, only when a name does not fit: first the path prefix all
names share is replaced by "…/", then the middle of a still-too-long name gives way
(a third of the room for its head, the rest for its tail, where the op itself is).
Full names stay in every ``--json`` output.

Example::

    fit_names(["Gradients/Default/net/MatMul-op1", "Gradients/Default/net/Add-op2"], 16)
    # ['…/MatMul-op1', '…/Add-op2']
"""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = ["fit_names", "fit_name", "name_width"]

ELLIPSIS = "…"
MIN_WIDTH = 24  # below this an op name is unreadable however it is cut


def fit_name(name: str, width: int) -> str:
    """``name`` in at most ``width`` characters, its middle elided when needed."""
    if len(name) <= width:
        return name
    if width <= 1:
        return ELLIPSIS[:width]
    room = width - 1
    head = room // 3
    return name[:head] + ELLIPSIS + name[len(name) - (room - head):]


def _common_dir(names: Sequence[str]) -> str:
    """The longest "/"-ended prefix every name shares (at least two names)."""
    if len(names) < 2:
        return ""
    prefix = os.path.commonprefix(list(names))
    cut = prefix.rfind("/")
    return prefix[:cut + 1] if cut > 0 else ""


def fit_names(names: Sequence[str], width: int) -> list[str]:
    """Every name in at most ``width`` characters (see the module doc)."""
    if all(len(n) <= width for n in names):
        return list(names)
    common = _common_dir(names)
    if len(common) > 2:
        names = [ELLIPSIS + "/" + n[len(common):] for n in names]
    return [fit_name(n, width) for n in names]


def name_width(console_width: int, other_columns: int) -> int:
    """Room for the name column: what the other columns leave, at least ``MIN_WIDTH``."""
    return max(MIN_WIDTH, console_width - other_columns)
