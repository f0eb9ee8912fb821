"""Numbers as report text (plain strings, no terminal styling): shared by every renderer."""

from __future__ import annotations

__all__ = ["fmt_bytes", "fmt_pct", "fmt_num"]


def fmt_bytes(x: float | None) -> str:
    if x is None:
        return "n/a"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f} B"


def fmt_pct(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{100 * x:.{digits}f}%"


def fmt_num(x: float | None, unit: str = "", digits: int = 4) -> str:
    if x is None:
        return "n/a"
    if abs(x) >= 1e4:
        s = f"{x:,.0f}"
    else:
        s = f"{x:.{digits}g}"
    return f"{s} {unit}".rstrip()
