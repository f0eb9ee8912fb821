"""The regimes and run conditions of a sheet as rows, for the terminal and HTML reports.

Rendering only: the numbers come from ``Sheet.regimes`` (``analysis.regimes``), whose
``conditions`` hold the median condition samples inside each regime.

Example::

    header, rows = regime_rows(sheet)        # one row per regime, steady one marked
    conditions_line(sheet)                   # "training thread on CPU 98%, queued 1%; ..."
"""

from __future__ import annotations

from typing import Any

from ..analysis.summary import Sheet
from .fmt import fmt_num, fmt_pct

__all__ = ["REGIME_HEADER", "regime_rows", "conditions_line", "headline_note", "sheet_text"]

REGIME_HEADER = ("regime", "steps", "step time", "tokens/s", "CPU/wall", "cause")


def _num(x: Any, fmt: str) -> str:
    return "n/a" if not isinstance(x, (int, float)) else format(x, fmt)


def regime_rows(sheet: Sheet) -> list[tuple[str, ...]]:
    """One row per regime (empty for a single-regime run); the steady one is starred."""
    if len(sheet.regimes) < 2:
        return []
    rows: list[tuple[str, ...]] = []
    for r in sheet.regimes:
        cause = str(r["cause"]) if r["cause"] == "reference" \
            else f"{r['cause']}: {r['evidence']}"
        rows.append((("* " if r["steady"] else "") + r["name"], str(r["steps"]),
                     _num(r["step_time_s"], ".4g") + " s", _num(r["tokens_per_s"], ",.0f"),
                     _num(r["cpu_per_wall"], ".2f"), cause))
    return rows


def conditions_line(sheet: Sheet) -> str:
    """The host's conditions over the steady-state steps, in one line ('' if none)."""
    steady = next((r for r in sheet.regimes if r["steady"]), None)
    if steady is None:
        return ""
    c = steady["conditions"]
    parts = []
    if "main_oncpu_frac" in c:
        parts.append(f"training thread on a CPU {c['main_oncpu_frac']:.0%} of the time, "
                     f"queued for one {c.get('main_runq_frac', 0.0):.0%}")
    elif steady.get("cpu_per_wall") is not None:
        parts.append(f"{steady['cpu_per_wall']:.2f} CPU-s per wall-s")
    if "others_cpu_cores" in c:
        parts.append(f"other processes {c['others_cpu_cores']:.1f} cores")
    if "load_1m" in c:
        parts.append(f"load {c['load_1m']:.1f}")
    if c.get("host_steal_frac"):
        parts.append(f"steal {c['host_steal_frac']:.0%}")
    if "cpu_mhz" in c:
        parts.append(f"CPU {c['cpu_mhz']:,.0f} MHz")
    if "gpu_sm_clock_mhz" in c:
        parts.append(f"GPU SM {c['gpu_sm_clock_mhz']:,.0f} MHz")
    if "gpu_temp_c" in c:
        parts.append(f"{c['gpu_temp_c']:.0f} °C")
    if "gpu_power_w" in c:
        parts.append(f"{c['gpu_power_w']:.0f} W")
    if c.get("gpu_throttle_reasons"):
        parts.append(f"GPU clock slow-down 0x{int(c['gpu_throttle_reasons']):x}")
    if c.get("gpu_other_procs"):
        parts.append(f"{c['gpu_other_procs']:.0f} other GPU processes")
    return "; ".join(parts)


def headline_note(sheet: Sheet) -> str:
    """Where the headline numbers come from, e.g. 'steady-state regime steps 70-149'."""
    if len(sheet.regimes) >= 2 and sheet.steady_regime:
        return f"steady-state regime {sheet.steady_regime} of {len(sheet.regimes)}"
    return "steady state"


def sheet_text(sheet: Sheet) -> dict[str, Any]:
    """The sheet's text as the terminal prints it, for the web page (one definition of how
    a headline number reads, so the progress bar, terminal and report.html show the same)."""
    return {"tokens_per_s": fmt_num(sheet.tokens_per_s), "mfu": fmt_pct(sheet.mfu),
            "headline_note": headline_note(sheet), "conditions": conditions_line(sheet),
            "regime_header": list(REGIME_HEADER), "regime_rows": regime_rows(sheet)}
