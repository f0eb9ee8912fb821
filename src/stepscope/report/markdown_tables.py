"""GitHub-flavoured Markdown tables for a training repo's README (rendering only).

The field report keeps its A/B tables in the training repo's README ("config | step time |
comm share | tokens/s | MFU"); these functions write them for a comparison, the
experiment index and a scaling study.

Example::

    print(comparison_markdown(result))
    print(index_markdown(query_index(db)))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..analysis.compare.runs import Comparison
from ..analysis.compare.scaling_efficiency import ScalingResult
from .fmt import fmt_bytes, fmt_num, fmt_pct

__all__ = ["md_table", "md_escape", "comparison_markdown", "index_markdown",
           "scaling_markdown", "INDEX_MD_COLUMNS", "config_label", "fmt_cell"]

# Index columns shown in the README table: (column, header, formatter).
INDEX_MD_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("name", "run", "text"), ("created_utc", "date", "date"),
    ("framework", "framework", "text"), ("framework_version", "version", "text"),
    ("device_kind", "device", "text"), ("num_devices", "devices", "num"),
    ("global_batch", "global batch", "num"), ("precision", "precision", "text"),
    ("step_time_s", "step time (s)", "num"), ("comm_exposed_frac", "comm share", "pct"),
    ("tokens_per_s", "tokens/s", "num"), ("mfu", "MFU", "pct"),
    ("mem_peak_bytes", "memory peak", "bytes"), ("loss_last", "loss", "num"),
)


def md_escape(value: Any) -> str:
    """Cell text: pipes escaped, line breaks flattened (a cell is one line in GFM)."""
    text = "" if value is None else str(value)
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]],
             align: Sequence[str] | None = None) -> str:
    """A GFM table; ``align`` per column: "l" or "r" (numbers)."""
    align = align or ["l"] * len(headers)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(md_escape(h) for h in headers) + " |",
             "| " + " | ".join(sep) + " |"]
    for row in rows:
        cells = [md_escape(c) for c in row] + [""] * (len(headers) - len(row))
        lines.append("| " + " | ".join(cells[: len(headers)]) + " |")
    return "\n".join(lines) + "\n"


def fmt_cell(value: Any, kind: str) -> str:
    """One index cell: kind is "text", "num", "pct", "bytes" or "date" (YYYYMMDD)."""
    if value is None:
        return "n/a"
    if kind == "pct":
        return fmt_pct(float(value))
    if kind == "bytes":
        return fmt_bytes(float(value))
    if kind == "num" and isinstance(value, (int, float)):
        return fmt_num(float(value))
    if kind == "date":
        return str(value)[:8]
    return str(value)


def config_label(result: Comparison, which: int) -> str:
    """Run name plus the differing variables' values in that run, e.g. "b (lr=3e-4)"."""
    diffs = ", ".join(f"{d.variable}={d.a if which == 0 else d.b}"
                      for d in result.independent)
    name = result.names[which]
    return f"{name} ({diffs})" if diffs else name


def comparison_markdown(result: Comparison) -> str:
    """The field report's A/B table plus the verdict line."""
    m = result.speed.metrics
    rows = []
    for i, key in enumerate(("a", "b")):
        def v(name: str, kind: str, _k: str = key) -> str:
            metric = m.get(name)
            return fmt_cell(getattr(metric, _k) if metric else None, kind)
        rows.append([config_label(result, i), v("step_time_s", "num"),
                     v("comm_exposed_frac", "pct"), v("tokens_per_s", "num"),
                     v("mfu", "pct")])
    table = md_table(["config", "step time (s)", "comm share", "tokens/s", "MFU"], rows,
                     ["l", "r", "r", "r", "r"])
    verdict = (f"**{result.verdict}** — speed: {result.speed.verdict}, "
               f"quality: {result.quality.verdict}")
    return table + "\n" + verdict + "\n"


def index_markdown(rows: Sequence[Mapping[str, Any]],
                   columns: Sequence[tuple[str, str, str]] = INDEX_MD_COLUMNS) -> str:
    """The experiment index as a README table (one row per run)."""
    return md_table([h for _, h, _ in columns],
                    [[fmt_cell(r.get(c), kind) for c, _, kind in columns] for r in rows],
                    ["r" if kind in ("num", "pct", "bytes") else "l" for _, _, kind in columns])


def scaling_markdown(result: ScalingResult) -> str:
    headers = ["run", "devices", result.unit, f"{result.unit} per device", "efficiency",
               "comm share", "MFU"]
    rows = [[p.name, p.num_devices, fmt_cell(p.throughput, "num"),
             fmt_cell(p.throughput_per_device, "num"), fmt_cell(p.efficiency, "pct"),
             fmt_cell(p.comm_share, "pct"), fmt_cell(p.mfu, "pct")] for p in result.points]
    return md_table(headers, rows, ["l", "r", "r", "r", "r", "r", "r"])
