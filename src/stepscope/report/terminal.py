"""The health-check sheet in the terminal (rich). Rendering only: no analysis here.

Example::

    from rich.console import Console
    render_sheet(Console(), sheet, meta, findings)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..analysis.summary import Sheet
from ..findings import Finding
from ..schema import RunMeta
from .fmt import fmt_bytes, fmt_num, fmt_pct
from .regimes_view import REGIME_HEADER, conditions_line, headline_note, regime_rows

__all__ = ["render_sheet", "fmt_bytes", "fmt_pct", "fmt_num", "PHASE_STYLE", "phase_bar"]

# Display order and colour of step phases.
PHASE_STYLE: dict[str, str] = {
    "data_wait": "red", "forward": "cyan", "backward": "blue", "forward_backward": "blue",
    "comm_exposed": "magenta", "comm": "magenta", "optimizer": "green", "other": "grey50",
}
_SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "dim"}


def phase_bar(phase_frac: dict[str, float], width: int = 60) -> Text:
    """A stacked bar of the step's time split, one coloured block per phase."""
    bar = Text()
    used = 0
    items = [(p, phase_frac[p]) for p in PHASE_STYLE if phase_frac.get(p)]
    for i, (phase, frac) in enumerate(items):
        n = width - used if i == len(items) - 1 else round(frac * width)
        bar.append("█" * max(0, n), style=PHASE_STYLE[phase])
        used += max(0, n)
    return bar


def _layer_table(title: str, rows: Sequence[tuple[str, str, str]]) -> Table:
    t = Table(title=title, title_justify="left", show_header=False, box=None,
              pad_edge=False, expand=False)
    t.add_column("metric", style="bold", min_width=18)
    t.add_column("value", justify="right", min_width=14)
    t.add_column("where measured", style="dim")
    for r in rows:
        t.add_row(*map(Text, r))  # Text, not markup: a value may hold "[...]"
    return t


def _result_rows(s: Sheet) -> list[tuple[str, str, str]]:
    loss = "n/a" if s.loss_last is None else f"{s.loss_first:.4g} → {s.loss_last:.4g}"
    return [
        ("loss first → last", loss, f"min {fmt_num(s.loss_min)}"),
        ("perplexity", fmt_num(s.perplexity), "exp(last loss), token cross-entropy"),
        ("accuracy", fmt_pct(s.accuracy_last), "last step"),
    ]


def _efficiency_rows(s: Sheet) -> list[tuple[str, str, str]]:
    steady = f"{s.steps - s.warmup_steps} steady steps, {s.warmup_steps} warm-up excluded"
    return [
        ("tokens/s", fmt_num(s.tokens_per_s), f"all ranks; {headline_note(s)}; {steady}"),
        ("samples/s", fmt_num(s.samples_per_s), ""),
        ("step time", fmt_num(s.step_time_s, "s"),
         f"median; p90 {fmt_num(s.step_time_p90_s, 's')}"),
        ("MFU", fmt_pct(s.mfu), s.mfu_note),
        ("HFU", fmt_pct(s.hfu), "hardware FLOPs incl. recompute"),
    ]


def _system_rows(s: Sheet) -> list[tuple[str, str, str]]:
    comm_where = ("recorded communication time" if s.comm_frac is not None else
                  "not measured (no collectives recorded)")
    return [
        ("memory peak", fmt_bytes(s.mem_peak_bytes), s.mem_source),
        ("data-wait share", fmt_pct(s.data_wait_frac), "time blocked in next(loader)"),
        ("comm share", fmt_pct(s.comm_frac), comm_where),
        ("exposed comm", fmt_pct(s.comm_exposed_frac), "comm with no compute running"),
        ("conditions", "", conditions_line(s) or "not recorded"),
    ]


def _regimes_table(s: Sheet) -> Table:
    t = Table(title="Regimes (* = steady state, used by the headline numbers)",
              title_justify="left", box=None, header_style="bold", expand=False)
    for col in REGIME_HEADER:
        t.add_column(col, justify="left" if col in ("regime", "cause") else "right")
    for row in regime_rows(s):
        t.add_row(*(escape(c) for c in row))
    return t


def _split_panel(s: Sheet) -> Group:
    legend = Text()
    for phase, style in PHASE_STYLE.items():
        if phase in s.phase_frac:
            legend.append("■ ", style=style)
            legend.append(f"{phase} {fmt_pct(s.phase_frac[phase])}  ")
    return Group(phase_bar(s.phase_frac), legend, Text(s.phase_source, style="dim"))


def _ranks_table(sheet: Sheet, limit: int = 16) -> Table:
    """Per-rank lines, slowest first (at most ``limit``; the rest are summarised)."""
    t = Table(title="Ranks (steady state), slowest first", title_justify="left",
              box=None, header_style="bold", expand=False)
    for col in ("rank", "step time", "tokens/s", "data wait", "comm total", "compute"):
        t.add_column(col, justify="right")
    lines = sorted(sheet.per_rank, key=lambda x: -(x.step_time_s or 0.0))
    fastest = min((x.step_time_s for x in lines if x.step_time_s), default=None)
    for x in lines[:limit]:
        slow = (fastest and x.step_time_s and x.step_time_s > 1.05 * fastest)
        t.add_row(Text(str(x.rank), style="bold yellow" if slow else ""),
                  fmt_num(x.step_time_s, "s"), fmt_num(x.tokens_per_s),
                  fmt_pct(x.data_wait_frac), fmt_pct(x.comm_frac), fmt_pct(x.compute_frac))
    if len(lines) > limit:
        t.add_row(f"+{len(lines) - limit}", "more ranks", "", "", "", "")
    return t


def _findings_table(findings: Sequence[Finding], limit: int) -> Table | Text:
    if not findings:
        return Text("No findings: nothing above info level.", style="green")
    t = Table(show_header=True, header_style="bold", box=None, expand=False)
    t.add_column("severity")
    t.add_column("category")
    t.add_column("finding")
    t.add_column("next step", style="dim")
    for f in list(findings)[:limit]:
        t.add_row(Text(f.severity, style=_SEVERITY_STYLE[f.severity]), Text(f.category),
                  Text(f.message), Text(f.recommendation, style="dim"))
    return t


def render_sheet(console: Console, sheet: Sheet, meta: RunMeta | None,
                 findings: Sequence[Finding] = (), extra: Sequence[Any] = (),
                 limit: int = 6) -> None:
    """Print the sheet: header, three layers, step split, top findings."""
    env = meta.environment if meta else {}
    title = (f"stepscope health-check sheet — {meta.run_id if meta else '?'} "
             f"[{meta.status if meta else '?'}]")
    sub = (f"{env.get('framework', '?')} {env.get('framework_version', '')} · "
           f"{env.get('device_name', '?')} · {sheet.ranks} rank(s) · {sheet.steps} steps")
    body = Group(
        Text(sub, style="dim"), Text(""),
        _layer_table("Result — is it converging?", _result_rows(sheet)), Text(""),
        _layer_table("Efficiency — how fast?", _efficiency_rows(sheet)), Text(""),
        _layer_table("System — are resources fed?", _system_rows(sheet)), Text(""),
        Text("Where a step's time goes", style="bold"), _split_panel(sheet), Text(""),
        *((_regimes_table(sheet), Text("")) if regime_rows(sheet) else ()),
        *((_ranks_table(sheet), Text("")) if sheet.per_rank else ()),
        Text("Top findings", style="bold"), _findings_table(findings, limit), *extra,
    )
    console.print(Panel(body, title=escape(title), title_align="left", expand=False))
    if sheet.skipped_records:
        console.print(f"[yellow]{sheet.skipped_records} corrupt or torn record(s) skipped"
                      "[/yellow]")
    for note in sheet.notes:
        console.print(Text(f"note: {note}", style="dim"))
