"""The latest captured profile in report.html: phases per step and the top ops.

Rendering only: the numbers are the trace analysis `stepscope run --profile-steps` writes
beside each capture (``serve_data.latest_profile``), a ``TraceReport.to_dict()``.

Example::

    html = profile_html(latest_profile(run))
"""

from __future__ import annotations

import html as _html
from collections.abc import Mapping
from typing import Any

from .names import fit_names

__all__ = ["profile_html"]

_PHASES = ("data", "forward", "backward", "comm_exposed", "optimizer", "other", "idle")
_OP_CHARS = 80  # the HTML table wraps; the full name is in each cell's title


def _e(x: Any) -> str:
    return _html.escape(str(x))


def _phases(rank: str, row: Mapping[str, Any]) -> str:
    means = row.get("phase_means_us") or {}
    total = sum(float(v) for v in means.values()) or 1.0
    cells = "".join(f"<td class=v>{float(means.get(p, 0.0)) / 1e3:.2f} ms "
                    f"({100 * float(means.get(p, 0.0)) / total:.0f}%)</td>" for p in _PHASES)
    return f"<tr><td>{_e(rank)}</td>{cells}</tr>"


def profile_html(doc: Mapping[str, Any] | None) -> str:
    """The profile section ('' when the run has no analysed capture)."""
    report = (doc or {}).get("report")
    if not isinstance(report, Mapping):
        status = (doc or {}).get("status")
        return f"<p class=dim>{_e(status)}</p>" if status else ""
    ranks = report.get("ranks") or {}
    head = "".join(f"<th>{p}</th>" for p in _PHASES)
    rows = "".join(_phases(r, row) for r, row in ranks.items() if isinstance(row, Mapping))
    ops = [o for o in report.get("top_ops") or [] if isinstance(o, Mapping)][:15]
    names = fit_names([str(o.get("name", "")) for o in ops], _OP_CHARS)
    op_rows = "".join(
        f"<tr><td>{_e(o.get('op_type') or o.get('name'))}</td>"
        f"<td title=\"{_e(o.get('name'))}\">{_e(n)}</td><td>{_e(o.get('kind'))}</td>"
        f"<td class=v>{_e(o.get('count'))}</td>"
        f"<td class=v>{float(o.get('total_us') or 0) / 1e3:.2f}</td>"
        f"<td class=v>{float(o.get('share_pct') or 0):.1f}%</td></tr>"
        for o, n in zip(ops, names, strict=True))
    return (f"<p class=dim>capture {_e((doc or {}).get('profile_dir', ''))}: mean per "
            f"profiled step</p><table><tr><th>rank</th>{head}</tr>{rows}</table>"
            "<h3>Top ops</h3><table><tr><th>type</th><th>op</th><th>kind</th><th>count</th>"
            f"<th>total ms</th><th>share</th></tr>{op_rows}</table>")
