"""Terminal views (rich) of an A/B comparison, the experiment index and a scaling study.

Rendering only: every number comes from ``analysis.compare``, ``index`` or
``analysis.scaling``.

Example::

    from rich.console import Console
    render_comparison(Console(), compare_runs(ta, ma, tb, mb))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..analysis.compare.runs import Comparison
from ..analysis.compare.scaling_efficiency import ScalingResult
from .fmt import fmt_bytes, fmt_num, fmt_pct
from .markdown_tables import INDEX_MD_COLUMNS, config_label, fmt_cell

__all__ = ["render_comparison", "render_index", "render_scaling"]

_VERDICT_STYLE = {"landed": "bold green", "not landed": "bold yellow", "invalid": "bold red",
                  "faster": "green", "slower": "red", "holds": "green", "regressed": "red",
                  "better": "green", "worse": "red", "inconclusive": "bold magenta"}
# How each speed metric is shown: label and value formatter.
_SPEED_FMT: dict[str, tuple[str, str]] = {
    "step_time_s": ("step time (median)", "s"), "tokens_per_s": ("tokens/s", "num"),
    "samples_per_s": ("samples/s", "num"), "mfu": ("MFU", "pct"),
    "comm_exposed_frac": ("exposed comm share", "pct"),
    "data_wait_frac": ("data-wait share", "pct"), "mem_peak_bytes": ("memory peak", "bytes"),
}


def _v(x: float | None, kind: str) -> str:
    if kind == "s":
        return fmt_num(x, "s")
    return {"pct": fmt_pct, "bytes": fmt_bytes}.get(kind, fmt_num)(x)


def _styled(word: str) -> Text:
    shown = "within noise" if word == "no significant difference" else word
    return Text(shown, style=_VERDICT_STYLE.get(word, "dim"))


def _signed_pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def _field_table(r: Comparison) -> Table:
    """config | step time | comm share | tokens/s | MFU, as in the field report."""
    t = Table(title="A/B", title_justify="left", header_style="bold")
    for col in ("config", "step time", "comm share", "tokens/s", "MFU"):
        t.add_column(col, justify="left" if col == "config" else "right")
    m = r.speed.metrics
    for i, key in enumerate(("a", "b")):
        def cell(name: str, kind: str, _k: str = key) -> str:
            metric = m.get(name)
            return _v(getattr(metric, _k) if metric else None, kind)
        t.add_row(escape(config_label(r, i)), cell("step_time_s", "s"),
                  cell("comm_exposed_frac", "pct"), cell("tokens_per_s", "num"),
                  cell("mfu", "pct"))
    return t


def _speed_table(r: Comparison) -> Table:
    level = int(round(100 * r.speed.ci_level))
    t = Table(title=f"Speed ledger — {r.speed.verdict}", title_justify="left",
              header_style="bold")
    for col in ("metric", "A", "B", "B vs A", f"{level}% interval", "noise", "call"):
        t.add_column(col, justify="left" if col in ("metric", "call") else "right")
    for name, m in r.speed.metrics.items():
        label, kind = _SPEED_FMT.get(name, (name, "num"))
        ci = (f"{_signed_pct(m.ci_rel[0])} … {_signed_pct(m.ci_rel[1])}"
              if m.ci_rel else "—")
        noise = f"±{100 * m.noise_rel:.1f}%" if m.noise_rel is not None else "—"
        # a share near zero reads in percentage points (0.0% -> 0.1% is +0.1 pp, not +300%)
        diff = (f"{m.diff_pp:+.1f} pp" if m.diff_pp is not None
                else _signed_pct(m.diff_rel))
        t.add_row(label, _v(m.a, kind), _v(m.b, kind), diff, ci, noise,
                  _styled(m.change))
    used = r.speed.steps_used
    ex = r.speed.excluded
    t.caption = (f"steady steps used: {used[0]} vs {used[1]}; warm-up rows excluded "
                 f"{ex['warmup_rows'][0]}/{ex['warmup_rows'][1]}, outlier steps "
                 f"{ex['outlier_steps'][0]}/{ex['outlier_steps'][1]}; bootstrap seed "
                 f"{r.speed.seed}")
    return t


def _quality_table(r: Comparison) -> Table:
    t = Table(title=f"Quality ledger — {r.quality.verdict}", title_justify="left",
              header_style="bold")
    for col in ("metric", "A", "B", "B − A", "at", "tolerance", "verdict"):
        t.add_column(col, justify="left" if col in ("metric", "at", "verdict") else "right")
    for name, m in r.quality.metrics.items():
        at = ", ".join(f"{k} {fmt_num(v)}" for k, v in m.at.items()) or escape(m.note)
        t.add_row(escape(name), fmt_num(m.a), fmt_num(m.b),
                  "n/a" if m.diff is None else f"{m.diff:+.4g}", at,
                  "n/a" if m.tolerance is None else f"{m.tolerance:.3g}", _styled(m.verdict))
    return t


def render_comparison(console: Console, r: Comparison) -> None:
    """Verdict, the differing variables, the A/B table and both ledgers."""
    console.print(Text.assemble(("verdict: ", "bold"), _styled(r.verdict), "  ",
                                ("; ".join(r.reasons), "dim")))
    for d in r.differing:
        extra = f" (follows {d.derived_from})" if d.derived_from else ""
        console.print(f"  differs: [bold]{escape(str(d))}[/bold]{escape(extra)}")
        if d.warning:
            console.print(f"  [yellow]trap: {escape(d.warning)}[/yellow]")
    for d in r.environment:
        style = "yellow" if d.condition else "dim"
        console.print(f"  [{style}]environment: {escape(d.warning or str(d))}[/{style}]")
    if r.speed.reason:
        console.print(f"  [dim]speed: {escape(r.speed.reason)}[/dim]")
    for w in r.quality.warnings:
        if not any(w == d.warning for d in r.differing):
            console.print(f"  [yellow]{escape(w)}[/yellow]")
    console.print(_field_table(r))
    console.print(_speed_table(r))
    console.print(_quality_table(r))


# The terminal shows fewer columns than the README table, to fit 100 characters.
_INDEX_TERMINAL = ("name", "created_utc", "num_devices", "global_batch", "step_time_s",
                   "comm_exposed_frac", "tokens_per_s", "mfu", "loss_last")


def render_index(console: Console, rows: Sequence[Mapping[str, Any]],
                 skipped: Sequence[Any] = (), summary: str = "") -> None:
    """The index as a table, then the skipped runs with their reasons."""
    t = Table(header_style="bold", title=summary or None, title_justify="left")
    cols = [c for c in INDEX_MD_COLUMNS if c[0] in _INDEX_TERMINAL]
    for _, header, kind in cols:
        t.add_column(header, justify="right" if kind in ("num", "pct", "bytes") else "left")
    for row in rows:
        t.add_row(*[escape(fmt_cell(row.get(c), kind)) for c, _, kind in cols])
    console.print(t)
    for s in skipped:
        console.print(f"[yellow]skipped {escape(s.path)}: {escape(s.reason)}[/yellow]")


def _scaling_row(p: Any) -> list[str]:
    return [escape(p.name), str(p.num_devices), fmt_num(p.throughput),
            fmt_num(p.throughput_per_device), fmt_pct(p.efficiency),
            fmt_pct(p.comm_share), fmt_pct(p.mfu)]


def render_scaling(console: Console, r: ScalingResult) -> None:
    t = Table(title=f"Scaling ({r.mode}) — efficiency vs the smallest run",
              title_justify="left", header_style="bold")
    for col in ("run", "devices", r.unit, "per device", "efficiency", "comm share", "MFU"):
        t.add_column(col, justify="left" if col == "run" else "right")
    for p in r.points:
        t.add_row(*_scaling_row(p))
    console.print(t)
    for d in r.differing:
        console.print(f"[yellow]also differs: {escape(str(d))} — it, not the device count, "
                      "may explain the numbers[/yellow]")
