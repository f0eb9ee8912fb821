"""Self-contained HTML report: one file, inline CSS and SVG plots, works offline.

Example::

    html = render_html(sheet, meta, table, findings)
    Path("report.html").write_text(html)
"""

from __future__ import annotations

import html as _html
import io
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..analysis.findings import Finding
from ..analysis.summary import Sheet
from ..schema import RunMeta, StepTable
from .fmt import fmt_bytes, fmt_num, fmt_pct

__all__ = ["render_html"]

_PHASE_COLOURS = {
    "data_wait_s": ("data wait", "#d62728"), "forward_s": ("forward", "#17becf"),
    "backward_s": ("backward", "#1f77b4"),
    "forward_backward_s": ("forward+backward", "#3b5fa8"),
    "comm_exposed_s": ("exposed comm", "#e377c2"),
    "optimizer_s": ("optimizer", "#2ca02c"),
}
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;
max-width:1100px;color:#222;padding:0 1rem}
h1{font-size:1.5rem;margin-bottom:.2rem}h2{font-size:1.15rem;margin-top:2rem;
border-bottom:1px solid #ddd;padding-bottom:.2rem}
.sub{color:#666}.grid{display:grid;grid-template-columns:repeat(3,1fr);gap:1rem}
.card{border:1px solid #e3e3e3;border-radius:8px;padding:.8rem 1rem}
.card h3{margin:.1rem 0 .5rem;font-size:1rem}
table{border-collapse:collapse;width:100%}td,th{padding:.25rem .4rem;text-align:left;
vertical-align:top}tr+tr td{border-top:1px solid #f0f0f0}td.v{text-align:right;
font-variant-numeric:tabular-nums;white-space:nowrap}.dim{color:#777;font-size:.85em}
.bar{display:flex;height:26px;border-radius:4px;overflow:hidden;margin:.5rem 0}
.bar div{height:100%}.legend span{margin-right:1rem}.sw{display:inline-block;width:.8em;
height:.8em;margin-right:.3em;border-radius:2px}
.critical{color:#b00020;font-weight:600}.warning{color:#a66300;font-weight:600}
.info{color:#666}.plots{display:grid;grid-template-columns:1fr 1fr;gap:1rem}
.plots svg{width:100%;height:auto}
"""


def _e(x: Any) -> str:
    return _html.escape(str(x))


def _rows(rows: Sequence[tuple[str, str, str]]) -> str:
    return "".join(f"<tr><td>{_e(a)}</td><td class=v>{_e(b)}</td>"
                   f"<td class=dim>{_e(c)}</td></tr>" for a, b, c in rows)


def _cards(s: Sheet) -> str:
    result = [("loss (last)", fmt_num(s.loss_last), f"first {fmt_num(s.loss_first)}"),
              ("perplexity", fmt_num(s.perplexity), "exp(last loss)"),
              ("accuracy", fmt_pct(s.accuracy_last), "last step")]
    eff = [("tokens/s", fmt_num(s.tokens_per_s), "steady state, all ranks"),
           ("samples/s", fmt_num(s.samples_per_s), ""),
           ("step time", fmt_num(s.step_time_s, "s"), f"p90 {fmt_num(s.step_time_p90_s, 's')}"),
           ("MFU", fmt_pct(s.mfu), s.mfu_note), ("HFU", fmt_pct(s.hfu), "incl. recompute")]
    system = [("memory peak", fmt_bytes(s.mem_peak_bytes), s.mem_source),
              ("data-wait share", fmt_pct(s.data_wait_frac), "blocked in next(loader)"),
              ("comm share", fmt_pct(s.comm_frac), "recorded collectives"),
              ("exposed comm", fmt_pct(s.comm_exposed_frac), "not overlapped")]
    cards = [("Result — converging?", result), ("Efficiency — how fast?", eff),
             ("System — resources fed?", system)]
    return "<div class=grid>" + "".join(
        f"<div class=card><h3>{_e(t)}</h3><table>{_rows(r)}</table></div>" for t, r in cards
    ) + "</div>"


def _split(s: Sheet) -> str:
    colours = {"data_wait": "#d62728", "forward": "#17becf", "backward": "#1f77b4",
               "forward_backward": "#3b5fa8",
               "comm_exposed": "#e377c2", "optimizer": "#2ca02c", "other": "#bbbbbb"}
    parts = [(p, f) for p, f in s.phase_frac.items() if f > 0]
    bar = "".join(f'<div title="{_e(p)} {fmt_pct(f)}" style="width:{100 * f:.3f}%;'
                  f'background:{colours.get(p, "#999")}"></div>' for p, f in parts)
    legend = "".join(f'<span><i class=sw style="background:{colours.get(p, "#999")}"></i>'
                     f"{_e(p)} {fmt_pct(f)}</span>" for p, f in parts)
    return (f"<div class=bar>{bar}</div><div class=legend>{legend}</div>"
            f"<p class=dim>{_e(s.phase_source)}</p>")


def _ranks(s: Sheet) -> str:
    if not s.per_rank:
        return ""
    rows = "".join(
        f"<tr><td>{x.rank}</td><td class=v>{_e(fmt_num(x.step_time_s, 's'))}</td>"
        f"<td class=v>{_e(fmt_num(x.tokens_per_s))}</td>"
        f"<td class=v>{_e(fmt_pct(x.data_wait_frac))}</td>"
        f"<td class=v>{_e(fmt_pct(x.comm_frac))}</td>"
        f"<td class=v>{_e(fmt_pct(x.compute_frac))}</td></tr>"
        for x in sorted(s.per_rank, key=lambda x: -(x.step_time_s or 0.0)))
    return ("<h2>Ranks (steady state), slowest first</h2><table><tr><th>rank</th>"
            "<th>step time</th><th>tokens/s</th><th>data wait</th><th>comm total</th>"
            f"<th>compute</th></tr>{rows}</table>")


def _findings(findings: Sequence[Finding]) -> str:
    if not findings:
        return "<p>No findings above info level.</p>"
    rows = "".join(
        f"<tr><td class={_e(f.severity)}>{_e(f.severity)}</td><td>{_e(f.category)}</td>"
        f"<td>{_e(f.message)}</td><td class=dim>{_e(f.recommendation)}</td></tr>"
        for f in findings)
    return ("<table><tr><th>severity</th><th>category</th><th>finding</th>"
            f"<th>next step</th></tr>{rows}</table>")


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _plots(t: StepTable) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    t = t.sorted()
    for col, label in (("loss", "training loss"), ("step_time_s", "step time (s)"),
                       ("lr", "learning rate"), ("grad_norm", "gradient norm"),
                       ("mem_peak_bytes", "memory peak (bytes)"),
                       ("loss_scale", "loss scale")):
        if not t.has_data(col):
            continue
        fig, ax = plt.subplots(figsize=(5.2, 2.8))
        for r in t.ranks():
            part = t.rank(r)
            ax.plot(part["step"], part[col], lw=1, label=f"rank {r}")
        ax.set_xlabel("step")
        ax.set_title(label, fontsize=10)
        if len(t.ranks()) > 1:
            ax.legend(fontsize=7)
        ax.grid(alpha=.3)
        out.append(_svg(fig))
    out.append(_phase_plot(t, plt))
    return "<div class=plots>" + "".join(o for o in out if o) + "</div>"


def _phase_plot(t: StepTable, plt: Any) -> str:
    cols = [c for c in _PHASE_COLOURS if t.has_data(c)]
    if not cols:
        return ""
    part = t.rank(t.ranks()[0])
    fig, ax = plt.subplots(figsize=(5.2, 2.8))
    ys = [np.nan_to_num(part[c]) for c in cols]
    ax.stackplot(part["step"], ys, labels=[_PHASE_COLOURS[c][0] for c in cols],
                 colors=[_PHASE_COLOURS[c][1] for c in cols], alpha=.85)
    ax.plot(part["step"], part["step_time_s"], color="k", lw=.8, label="step time")
    ax.set_title(f"step time split (s), rank {t.ranks()[0]}", fontsize=10)
    ax.set_xlabel("step")
    ax.legend(fontsize=7, ncol=3)
    ax.grid(alpha=.3)
    return _svg(fig)


def _baseline(meta: RunMeta | None) -> str:
    if meta is None or not meta.baseline:
        return "<p class=dim>No baseline fingerprint recorded.</p>"
    rows = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>"
                   for k, v in sorted(meta.baseline.items()))
    return f"<table>{rows}</table>"


def render_html(sheet: Sheet, meta: RunMeta | None, table: StepTable,
                findings: Sequence[Finding] = (), sections: Sequence[tuple[str, str]] = ()
                ) -> str:
    """The whole report as one HTML string. ``sections``: extra (title, html) blocks."""
    env = meta.environment if meta else {}
    title = f"stepscope — {meta.run_id if meta else 'run'}"
    sub = (f"{env.get('framework', '?')} {env.get('framework_version', '')} · "
           f"{env.get('device_name', '?')} · {sheet.ranks} rank(s) · {sheet.steps} steps · "
           f"status {meta.status if meta else '?'}")
    extra = "".join(f"<h2>{_e(t)}</h2>{body}" for t, body in sections)
    skipped = (f"<p class=warning>{sheet.skipped_records} corrupt or torn record(s) "
               "skipped</p>" if sheet.skipped_records else "")
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{_e(title)}</title>"
            f"<style>{_CSS}</style></head><body><h1>{_e(title)}</h1>"
            f"<div class=sub>{_e(sub)}</div>{skipped}"
            f"<h2>Health-check sheet</h2>{_cards(sheet)}"
            f"<h2>Where a step's time goes</h2>{_split(sheet)}{_ranks(sheet)}"
            f"<h2>Findings</h2>{_findings(findings)}{extra}"
            f"<h2>Curves</h2>{_plots(table) if len(table) else ''}"
            f"<h2>Baseline fingerprint</h2>{_baseline(meta)}"
            f"<p class=dim>Generated by stepscope {_e(env.get('stepscope_version', ''))}."
            "</p></body></html>")
