"""Trace breakdowns in the terminal (rich): per-step stacked bars, rank table, top ops, diff.

Rendering only; the numbers come from :mod:`stepscope.analysis.trace.breakdown` and
:mod:`stepscope.analysis.trace.diff`.

Example::

    from rich.console import Console
    render_trace_report(Console(), analyze(read_trace("trace.json.gz")))
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..analysis.trace.breakdown import RankReport, TraceReport
from ..analysis.trace.diff import TraceDiff
from ..analysis.trace.steps import BAR_PHASES, StepRow
from .names import fit_names, name_width

__all__ = ["render_trace_report", "render_trace_diff", "BAR_STYLE"]

BAR_STYLE: dict[str, str] = {
    "data": "red", "forward": "cyan", "backward": "blue", "comm_exposed": "magenta",
    "optimizer": "green", "other": "grey50", "idle": "grey23",
}
# Characters the other columns of the op tables take (values, borders, padding).
_OPS_OTHER_COLS = 66
_DIFF_OTHER_COLS = 58
_MAX_STEP_ROWS = 12  # per rank; longer traces show the first ones and say so


def _ms(us: float | None) -> str:
    return "n/a" if us is None else f"{us / 1000:.1f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}%"


def _bar(row: StepRow, width: int, scale_us: float) -> Text:
    bar = Text()
    used = 0
    total = round(width * row.step_time_us / scale_us) if scale_us > 0 else width
    for phase in BAR_PHASES:
        us = getattr(row, f"{phase}_us")
        n = round(width * us / scale_us) if scale_us > 0 else 0
        n = min(n, total - used)
        if n > 0:
            bar.append("█" * n, style=BAR_STYLE[phase])
            used += n
    return bar


def _legend() -> Text:
    t = Text("  ")
    for phase in BAR_PHASES:
        t.append("█ ", style=BAR_STYLE[phase])
        t.append(f"{phase}  ")
    return t


def _rank_table(report: TraceReport) -> Table:
    tab = Table(title="Ranks (" + ("HTA 0.5.0 conventions" if report.hta_compatible
                                   else "exact, whole steps") + ")", title_justify="left")
    for col in ("rank", "view", "idle", "compute", "non-compute", "comm/compute overlap",
                "median step ms"):
        tab.add_column(col, justify="right" if col not in ("view",) else "left")
    for rank, rep in sorted(report.ranks.items()):
        d = rep.to_dict()
        overlap = _pct(d["comm_comp_overlap_pct"]) if d["comm_comp_overlap_pct"] is not None \
            else "no comm found"
        tab.add_row(str(rank), str(d["view"]), _pct(d["idle_pct"]), _pct(d["compute_pct"]),
                    _pct(d["non_compute_pct"]), overlap, _ms(rep.step_time_median_us()))
    return tab


def _step_section(console: Console, rep: RankReport, width: int) -> None:
    if not rep.steps:
        return
    scale = max(r.step_time_us for r in rep.steps)
    tab = Table(title=f"rank {rep.rank}: steps (ms)", title_justify="left", box=None)
    tab.add_column("step", justify="right")
    tab.add_column("ms", justify="right")
    tab.add_column("split")
    for p in ("data", "fwd", "bwd", "comm", "opt", "idle"):
        tab.add_column(p, justify="right")
    for r in rep.steps[:_MAX_STEP_ROWS]:
        tab.add_row(str(r.step), _ms(r.step_time_us), _bar(r, width, scale), _ms(r.data_us),
                    _ms(r.forward_us), _ms(r.backward_us), _ms(r.comm_exposed_us),
                    _ms(r.optimizer_us), _ms(r.idle_us))
    console.print(tab)
    if len(rep.steps) > _MAX_STEP_ROWS:
        console.print(f"  ... {len(rep.steps) - _MAX_STEP_ROWS} more steps (see --json)")


def _ops_table(report: TraceReport, top: int, console_width: int) -> Table:
    ops = report.top_ops[:top]
    tab = Table(title=f"Top {top} ops", title_justify="left")
    width = name_width(console_width, _OPS_OTHER_COLS)
    for col in ("op", "kind", "count", "total ms", "self ms", "share", "queue µs"):
        tab.add_column(col, justify="left" if col in ("op", "kind") else "right",
                       overflow="fold", no_wrap=col != "op",
                       min_width=None if col == "op" else len(col),
                       max_width=width if col == "op" else None)
    for o, name in zip(ops, fit_names([o.name for o in ops], width), strict=True):
        tab.add_row(_op_cell(o.op_type, name), o.kind, str(o.count), _ms(o.total_us),
                    _ms(o.self_us), f"{o.share_pct:.1f}%",
                    "-" if o.queue_mean_us is None else f"{o.queue_mean_us:.1f}")
    return tab


def _op_cell(op_type: str, fitted_name: str) -> str:
    """The op type on its own line above the (fitted) name when they differ: MindSpore
    names carry their scope first, and fitting one to the width must not hide the type
    (``Conv2DBackpropFilter`` of ``Gradients/.../conv2-Conv2d/Conv2DBackpropFilter-op1``)."""
    if not op_type or op_type == fitted_name:
        return escape(fitted_name)
    return f"[bold]{escape(op_type)}[/bold]\n[dim]{escape(fitted_name)}[/dim]"


def render_trace_report(console: Console, report: TraceReport, top: int = 10) -> None:
    """Print the rank table, per-step stacked bars, comparison, top ops and warnings."""
    console.print(_rank_table(report))
    width = max(20, min(50, console.width - 70))
    for rep in report.ranks.values():
        _step_section(console, rep, width)
    if any(rep.steps for rep in report.ranks.values()):
        console.print(_legend())
    c = report.comparison
    if c is not None:
        # A difference that rounds to 0.0 ms names no phase (it once printed "+0.0 ms").
        differs = (f"it differs most in [bold]{c.differing_phase}[/bold] "
                   f"({c.phase_delta_us / 1000:+.1f} ms per step vs the other ranks)"
                   if abs(c.phase_delta_us) >= 50 else
                   "no phase differs by 0.1 ms per step or more from the other ranks")
        console.print(
            f"Slowest rank: {c.slowest_rank} (median step {c.slower_by_pct:.1f}% longer than "
            f"rank {c.fastest_rank}). Longest working time: rank {c.straggler_rank}"
            + (f" (straggler score {c.straggler_score:.2f})" if c.straggler_score else "")
            + f"; {differs}.")
    if report.top_ops:
        console.print(_ops_table(report, top, console.width))
    for note in report.conventions:
        console.print(f"[dim]convention: {escape(note)}[/dim]")
    for w in report.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(w)}")


def render_trace_diff(console: Console, diff: TraceDiff, top: int = 20) -> None:
    """Print per-phase and per-op deltas (B against baseline A, per step)."""
    console.print(f"A: {diff.a_steps} rank-steps, mean step {_ms(diff.step_time_a_us)} ms; "
                  f"B: {diff.b_steps} rank-steps, mean step {_ms(diff.step_time_b_us)} ms")
    ph = Table(title="Phases (ms per step)", title_justify="left")
    for col in ("phase", "A", "B", "delta", "status"):
        ph.add_column(col, justify="left" if col in ("phase", "status") else "right")
    for p in diff.phases:
        ph.add_row(p.phase, _ms(p.a_us), _ms(p.b_us), f"{p.delta_us / 1000:+.2f}", p.status)
    console.print(ph)
    ops = Table(title=f"Ops by {'op type' if diff.matched_by == 'type' else 'name'} "
                      f"(µs per step, largest changes first, top {top})",
                title_justify="left")
    width = name_width(console.width, _DIFF_OTHER_COLS)
    for col in ("op type" if diff.matched_by == "type" else "op", "kind", "A", "B", "delta",
                "status"):
        first = col.startswith("op")
        ops.add_column(col, justify="left" if first or col in ("kind", "status") else "right",
                       overflow="fold", no_wrap=not first, min_width=None if first else 7,
                       max_width=width if first else None)
    shown = diff.ops[:top]
    for o, name in zip(shown, fit_names([o.name for o in shown], width), strict=True):
        ops.add_row(escape(name), o.kind, f"{o.a_us_per_step:.1f}",
                    f"{o.b_us_per_step:.1f}", f"{o.delta_us_per_step:+.1f}", o.status)
    console.print(ops)
