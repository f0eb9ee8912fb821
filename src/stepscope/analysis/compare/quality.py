"""The quality ledger of an A/B comparison: training loss at matched progress, and evals.

A speed-up that costs quality did not land (field report, "Keep it running"). Two kinds of
evidence are compared, B against baseline A:

* Training loss at matched progress: matched on cumulative tokens when both runs recorded
  tokens (a run with a larger global batch takes fewer steps for the same data), else on
  the step index. Each run's loss is smoothed by averaging it over the same trailing window
  of progress, the last ``LOSS_WINDOW_FRAC`` of the matched point, so both averages cover
  the same data range. B regressed when its smoothed loss is higher by more than
  ``LOSS_NOISE_Z`` standard errors of the two window means (step-to-step loss noise).
* Evaluation metrics recorded with ``stepscope eval-log`` (events of type ``eval``): the
  value at the latest step both runs evaluated; B regressed when worse by more than
  ``eval_tolerance_rel`` of A's value. Lower is better for names containing a token of
  ``LOWER_IS_BETTER`` (loss, perplexity, error rates); higher for the rest.

Verdict: ``regressed`` if any metric regressed, ``holds`` if at least one was compared and
none regressed, ``unknown`` when nothing could be compared.

Example::

    q = quality_ledger(table_a, table_b, evals_a, evals_b)
    q.verdict                 # "holds" | "regressed" | "unknown"
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ..._fastnp import unique_ints
from ...schema import StepTable, eval_record

__all__ = [
    "QualityMetric", "QualityLedger", "quality_ledger", "eval_record", "latest_evals",
    "LOSS_WINDOW_FRAC", "LOSS_NOISE_Z", "EVAL_TOLERANCE_REL", "LOWER_IS_BETTER",
]

# Trailing window of progress the loss is averaged over: 10% of the matched point (at
# least one record). stepscope's choice: long enough to average out step noise, short
# enough that the loss barely trends inside it.
LOSS_WINDOW_FRAC = 0.10
# Two standard errors: a one-sided ~97.5% normal bound on the difference of window means.
LOSS_NOISE_Z = 2.0
# An eval metric worse by more than 0.5% of the baseline's value regressed. stepscope's
# default (the field report gives none); a fixed validation set is deterministic, so this
# only absorbs numeric jitter. Pass ``eval_tolerance_rel`` for evals with sampling noise.
EVAL_TOLERANCE_REL = 0.005
# Name tokens of metrics where lower is better.
LOWER_IS_BETTER = ("loss", "perplexity", "ppl", "error", "err", "wer", "cer", "bpb", "nll")

FloatArray = npt.NDArray[np.float64]


@dataclass
class QualityMetric:
    name: str
    a: float | None
    b: float | None
    better: str  # "lower" | "higher"
    at: dict[str, float] = field(default_factory=dict)  # {"tokens": x} or {"step": n}
    diff: float | None = None
    tolerance: float | None = None  # largest worsening still called "holds"
    verdict: str = "unknown"  # "holds" | "regressed" | "unknown"
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "better": self.better, "at": self.at,
                "diff": self.diff, "tolerance": self.tolerance, "verdict": self.verdict,
                "note": self.note}

    @classmethod
    def from_dict(cls, name: str, d: Mapping[str, Any]) -> QualityMetric:
        """The metric ``to_dict`` gave."""
        return cls(name, d["a"], d["b"], d["better"], at=dict(d["at"]), diff=d["diff"],
                   tolerance=d["tolerance"], verdict=d["verdict"], note=d["note"])


@dataclass
class QualityLedger:
    verdict: str
    metrics: dict[str, QualityMetric]
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: m.to_dict() for k, m in self.metrics.items()}
        out.update(verdict=self.verdict, warnings=list(self.warnings))
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> QualityLedger:
        """The ledger ``to_dict`` gave (its metrics are named ``train_loss``, ``eval:*``)."""
        metrics = {k: QualityMetric.from_dict(k, v) for k, v in d.items()
                   if k not in ("verdict", "warnings")}
        return cls(verdict=d["verdict"], metrics=metrics, warnings=list(d["warnings"]))


def latest_evals(events: Sequence[Mapping[str, Any]]) -> dict[str, dict[int, float]]:
    """``metric -> {step: value}`` from eval events (a later record for a step wins)."""
    out: dict[str, dict[int, float]] = {}
    for ev in events:
        if ev.get("type") != "eval" or not isinstance(ev.get("step"), int):
            continue
        metrics = ev.get("metrics")
        if not isinstance(metrics, Mapping):
            continue
        for name, value in metrics.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                out.setdefault(str(name), {})[int(ev["step"])] = float(value)
    return out


def _direction(name: str) -> str:
    tokens = re.split(r"[^a-z0-9]+", name.lower())
    return "lower" if any(t in LOWER_IS_BETTER for t in tokens) else "higher"


def _loss_curve(table: StepTable, use_tokens: bool) -> tuple[FloatArray, FloatArray]:
    """(progress, loss) per step: mean loss over ranks; progress = cumulative tokens."""
    steps = unique_ints(table["step"])
    pos = np.searchsorted(steps, table["step"])
    n = len(steps)
    loss_sum = np.bincount(pos, weights=np.nan_to_num(table["loss"]), minlength=n)
    loss_cnt = np.bincount(pos, weights=np.isfinite(table["loss"]).astype(float), minlength=n)
    if use_tokens:
        tok = np.bincount(pos, weights=np.nan_to_num(table["tokens"]), minlength=n)
        x = np.cumsum(tok)
    else:
        x = steps.astype(np.float64)
    ok = loss_cnt > 0
    return x[ok].astype(np.float64), np.asarray(loss_sum[ok] / loss_cnt[ok], np.float64)


def _window(x: FloatArray, y: FloatArray, lo: float, hi: float) -> FloatArray:
    sel = y[(x >= lo) & (x <= hi)]
    if not sel.size:  # window between two records: take the last record before hi
        sel = y[x <= hi][-1:]
    return sel


def _loss_metric(table_a: StepTable, table_b: StepTable) -> QualityMetric:
    m = QualityMetric("train_loss", None, None, "lower")
    if not (table_a.has_data("loss") and table_b.has_data("loss")):
        m.note = "loss not recorded in both runs"
        return m
    use_tokens = table_a.has_data("tokens") and table_b.has_data("tokens")
    xa, ya = _loss_curve(table_a, use_tokens)
    xb, yb = _loss_curve(table_b, use_tokens)
    hi = float(min(xa[-1], xb[-1]))
    if hi < max(xa[0], xb[0]):
        m.note = "the runs' progress ranges do not overlap"
        return m
    lo = hi - LOSS_WINDOW_FRAC * hi
    wa, wb = _window(xa, ya, lo, hi), _window(xb, yb, lo, hi)
    m.a, m.b = float(wa.mean()), float(wb.mean())
    m.at = {"tokens" if use_tokens else "step": hi}
    m.diff = m.b - m.a

    def se(w: FloatArray) -> float:
        return float(w.std(ddof=1) / math.sqrt(len(w))) if len(w) > 1 else 0.0

    m.tolerance = LOSS_NOISE_Z * math.hypot(se(wa), se(wb))
    m.verdict = "regressed" if m.diff > m.tolerance else "holds"
    m.note = (f"mean loss over {'tokens' if use_tokens else 'steps'} {lo:.6g}..{hi:.6g} "
              f"({len(wa)} vs {len(wb)} records)")
    return m


def _eval_metric(name: str, a: dict[int, float], b: dict[int, float],
                 tolerance_rel: float) -> QualityMetric:
    m = QualityMetric(f"eval:{name}", None, None, _direction(name))
    common = sorted(set(a) & set(b))
    if not common:
        m.note = (f"evaluated at different steps (A: {sorted(a)[-3:]}, B: {sorted(b)[-3:]});"
                  " log an eval at a common step")
        return m
    step = common[-1]
    m.a, m.b, m.at = a[step], b[step], {"step": float(step)}
    m.diff = m.b - m.a
    m.tolerance = tolerance_rel * abs(m.a)
    worse = m.diff if m.better == "lower" else -m.diff
    m.verdict = "regressed" if worse > m.tolerance else "holds"
    return m


def quality_ledger(table_a: StepTable, table_b: StepTable,
                   evals_a: Sequence[Mapping[str, Any]] = (),
                   evals_b: Sequence[Mapping[str, Any]] = (), *,
                   eval_tolerance_rel: float = EVAL_TOLERANCE_REL) -> QualityLedger:
    """Quality of B against baseline A (pure; inputs are not modified).

    ``evals_*`` are the run's events (``RunDir.read_events("eval")``); other types are
    ignored.
    """
    metrics = {"train_loss": _loss_metric(table_a, table_b)}
    ea, eb = latest_evals(evals_a), latest_evals(evals_b)
    for name in sorted(set(ea) | set(eb)):
        if name in ea and name in eb:
            metrics[f"eval:{name}"] = _eval_metric(name, ea[name], eb[name],
                                                   eval_tolerance_rel)
        else:
            metrics[f"eval:{name}"] = QualityMetric(
                f"eval:{name}", None, None, _direction(name),
                note=f"recorded only in run {'A' if name in ea else 'B'}")
    verdicts = [m.verdict for m in metrics.values()]
    verdict = ("regressed" if "regressed" in verdicts
               else "holds" if "holds" in verdicts else "unknown")
    return QualityLedger(verdict=verdict, metrics=metrics)
