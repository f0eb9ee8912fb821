"""The health-check sheet: the three layers of metrics of one run, from its step table.

result     loss, perplexity, accuracy            -- is it converging?
efficiency tokens/s, samples/s, step time, MFU/HFU -- how fast?
system     memory peak, data-wait share, communication share -- are resources fed?

Example::

    table, stats = RunDir.open("runs/exp1").read_steps()
    sheet = summarize(table, run.read_meta(), skipped_records=stats.skipped)
    sheet.tokens_per_s, sheet.mfu, sheet.phase_frac["backward"]

Conventions (one definition for every report, ledger and index):

* Warm-up steps are excluded (``steady_mask``): the first step of each rank always
  (allocation, autotuning, compilation), then leading steps slower than 1.5x the median of
  the rest, at most 20% of the rank's steps. The 1.5x band and 20% cap are stepscope's
  choices: wide enough to keep normal jitter, narrow enough to drop compile steps.
* Throughput = sum(tokens) / sum(step_time_s) over steady steps, per rank, summed over
  ranks (each data-parallel rank contributes its own tokens).
* MFU = tokens/s x model FLOPs per token / (devices x dense peak FLOP/s per device)
  (PaLM App. B definition); HFU uses hardware FLOPs per token (recompute counted). Both
  need ``flops_per_token`` and ``peak_flops_per_device`` in run.json's environment;
  otherwise they are None and ``mfu_note`` says why.
* Phase shares use device-synced rows when the run has any (see recorder), else all rows;
  ``other`` is the step time not attributed to a phase.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..calc import flops
from ..schema import BETWEEN_STEP_COLUMNS, AnyArray, RunMeta, StepTable

__all__ = ["Sheet", "RankLine", "summarize", "steady_mask", "run_mfu", "WARMUP_SLOW_FACTOR",
           "WARMUP_MAX_FRAC"]

# Leading steps slower than this factor x the median of the remaining steps are warm-up.
WARMUP_SLOW_FACTOR = 1.5
# At most this share of a rank's steps is ever treated as warm-up.
WARMUP_MAX_FRAC = 0.2

_PHASE_COLUMNS = {
    "data_wait": "data_wait_s",
    "forward": "forward_s",
    "backward": "backward_s",
    # Frameworks that fuse the two (MindSpore value_and_grad) record one phase.
    "forward_backward": "forward_backward_s",
    "comm_exposed": "comm_exposed_s",
    "optimizer": "optimizer_s",
}


def _rank_warmup(step_time: AnyArray) -> int:
    n = len(step_time)
    if n <= 2:
        return min(n - 1, 1) if n else 0
    cap = max(1, int(n * WARMUP_MAX_FRAC))
    k = 1
    rest = step_time[1:]
    finite = rest[np.isfinite(rest)]
    if not finite.size:
        return 1
    ref = float(np.median(finite))
    while k < cap and np.isfinite(step_time[k]) and step_time[k] > WARMUP_SLOW_FACTOR * ref:
        k += 1
    return k


def steady_mask(table: StepTable) -> AnyArray:
    """Boolean mask of steady-state rows (warm-up excluded per rank; see module doc)."""
    mask = np.zeros(len(table), dtype=bool)
    ranks = table["rank"]
    for r in np.unique(ranks):
        idx = np.flatnonzero(ranks == r)
        idx = idx[np.argsort(table["step"][idx], kind="stable")]
        k = _rank_warmup(table["step_time_s"][idx])
        mask[idx[k:]] = True
    return mask


def _nan_to_none(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


@dataclass
class RankLine:
    """One rank's steady-state line of the sheet (fractions 0..1; None = not measured)."""

    rank: int
    steps: int
    step_time_s: float | None
    tokens_per_s: float | None
    data_wait_frac: float | None
    comm_frac: float | None
    compute_frac: float | None


@dataclass
class Sheet:
    """One run's health-check sheet. Fractions are 0..1; None = not measured."""

    steps: int
    ranks: int
    warmup_steps: int
    # result layer
    loss_first: float | None
    loss_last: float | None
    loss_min: float | None
    perplexity: float | None
    accuracy_last: float | None
    # efficiency layer
    tokens_per_s: float | None
    samples_per_s: float | None
    step_time_s: float | None
    step_time_p90_s: float | None
    mfu: float | None
    hfu: float | None
    mfu_note: str
    # system layer
    mem_peak_bytes: float | None
    mem_source: str
    data_wait_frac: float | None
    comm_frac: float | None
    comm_exposed_frac: float | None
    phase_frac: dict[str, float]
    phase_source: str
    skipped_records: int = 0
    notes: list[str] = field(default_factory=list)
    per_rank: list[RankLine] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _share(table: StepTable, col: str, denom: float) -> float | None:
    if not table.has_data(col) or denom <= 0:
        return None
    return float(np.nansum(table[col]) / denom)


def _phase_split(steady: StepTable) -> tuple[dict[str, float], str]:
    rows = steady
    source = "host times on every step (exact on CPU)"
    if steady.has_data("synced") and np.nansum(steady["synced"]) > 0:
        synced = steady.select(steady["synced"] == 1)
        if not np.all(steady["synced"] == 1):
            rows = synced
            source = f"device-synced steps ({len(synced)} of {len(steady)})"
        else:
            source = "device-synced every step"
    total = float(np.nansum(rows["step_time_s"]))
    split: dict[str, float] = {}
    for phase, col in _PHASE_COLUMNS.items():
        share = _share(rows, col, total)
        if share is not None:
            split[phase] = share
    if split:
        split["other"] = max(0.0, 1.0 - sum(split.values()))
    return split, source


def _throughput(steady: StepTable, col: str) -> float | None:
    if not steady.has_data(col):
        return None
    total = 0.0
    for r in steady.ranks():
        part = steady.rank(r)
        t = float(np.nansum(part["step_time_s"]))
        if t > 0:
            total += float(np.nansum(part[col])) / t
    return total or None


def run_mfu(tokens_per_s: float | None, meta: RunMeta | None, ranks: int = 1
            ) -> tuple[float | None, float | None, str]:
    """(MFU, HFU, note) of a throughput with run.json's FLOPs per token and device peak.

    The one MFU of reports, ledgers, the index and the demo's live progress line; the
    formula is the calculator's (:func:`stepscope.calc.flops.mfu`). Devices: run.json's
    ``num_devices``, else ``ranks``. Unknown inputs give None and the note says which.

    Example::

        mfu, hfu, note = run_mfu(sheet.tokens_per_s, run.read_meta(), ranks=2)
    """
    env = meta.environment if meta else {}
    fpt, peak = _positive(env.get("flops_per_token")), _positive(env.get("peak_flops_per_device"))
    if tokens_per_s is None or not tokens_per_s > 0:
        return None, None, "no token counts recorded"
    if fpt is None:
        return None, None, "model FLOPs per token unknown (record flops_per_token)"
    if peak is None:
        return None, None, str(env.get("peak_flops_source") or "device peak FLOP/s unknown")
    devices = max(1, int((meta.baseline.get("num_devices") if meta else None) or ranks or 1))
    hw = _positive(env.get("hardware_flops_per_token")) or fpt
    conv = env.get("flops_convention", "unspecified convention")
    src = env.get("peak_flops_source", "unspecified source")
    return (flops.mfu(tokens_per_s, fpt, peak, devices),
            flops.hfu(tokens_per_s, hw, peak, devices),
            f"{conv}; peak {peak / 1e12:.3g} TFLOP/s per device ({src})")


def _positive(v: Any) -> float | None:
    """``v`` as a float when it is a finite positive number, else None."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) and x > 0 else None


def _rank_lines(steady: StepTable) -> list[RankLine]:
    """Per-rank medians and shares; compute = forward + backward (+ fused) + optimizer."""
    out = []
    for r in steady.ranks():
        part = steady.rank(r)
        st = part["step_time_s"][np.isfinite(part["step_time_s"])]
        total = float(st.sum()) if st.size else 0.0
        comp = [c for c in ("forward_s", "backward_s", "forward_backward_s", "optimizer_s")
                if part.has_data(c)]
        compute = (float(sum(np.nansum(part[c]) for c in comp)) / total
                   if comp and total > 0 else None)
        out.append(RankLine(
            rank=r, steps=len(part), step_time_s=float(np.median(st)) if st.size else None,
            tokens_per_s=_throughput(part, "tokens"),
            data_wait_frac=_share(part, "data_wait_s", total),
            comm_frac=_share(part, "comm_s", total), compute_frac=compute))
    return out


def _loss_stats(table: StepTable) -> tuple[float | None, float | None, float | None]:
    if not table.has_data("loss"):
        return None, None, None
    order = np.lexsort((table["rank"], table["step"]))
    loss = table["loss"][order]
    finite = loss[np.isfinite(loss)]
    if not finite.size:
        return None, None, None
    return float(finite[0]), float(finite[-1]), float(finite.min())


def _recording_notes(table: StepTable, meta: RunMeta | None) -> list[str]:
    """What the sheet's numbers mean where a loop departs from the plain one (issue 13)."""
    config = meta.config if meta else {}
    out = [f"{what}: {config[key]}" for key, what in
           (("loss_convention", "loss"), ("step_boundary", "step boundary")) if key in config]
    between = {c.removesuffix("_s"): float(np.nansum(table[c])) for c in BETWEEN_STEP_COLUMNS
               if len(table) and table.has_data(c)}
    if any(between.values()):
        out.append("between steps, not in step time: " + ", ".join(
            f"{k} {v:.3g} s" for k, v in between.items() if v))
    return out


def summarize(table: StepTable, meta: RunMeta | None = None,
              skipped_records: int = 0) -> Sheet:
    """The sheet of one run (all ranks). Pure: reads the table, returns a ``Sheet``."""
    ranks = len(table.ranks())
    steps = int(len(np.unique(table["step"]))) if len(table) else 0
    mask = steady_mask(table)
    steady = table.select(mask) if mask.any() else table
    notes: list[str] = []
    if len(table) and not mask.any():
        notes.append("too few steps to exclude warm-up; all steps used")
    notes.extend(_recording_notes(table, meta))
    st = steady["step_time_s"]
    st = st[np.isfinite(st)]
    total = float(st.sum()) if st.size else 0.0
    tps = _throughput(steady, "tokens")
    mfu, hfu, mfu_note = run_mfu(tps, meta, ranks)
    phase_frac, phase_source = _phase_split(steady) if total else ({}, "no steps")
    first, last, lmin = _loss_stats(table)
    acc = table["accuracy"][np.isfinite(table["accuracy"])] if len(table) else np.array([])
    mem = table["mem_peak_bytes"] if len(table) else np.array([])
    mem = mem[np.isfinite(mem)]
    # Perplexity = exp(loss) holds when loss is the mean token cross-entropy in nats.
    ppl = math.exp(last) if last is not None and last < 50 else None
    return Sheet(
        steps=steps, ranks=ranks, warmup_steps=int(len(table) - mask.sum()) if mask.any() else 0,
        loss_first=first, loss_last=last, loss_min=lmin, perplexity=ppl,
        accuracy_last=float(acc[-1]) if acc.size else None,
        tokens_per_s=tps, samples_per_s=_throughput(steady, "samples"),
        step_time_s=float(np.median(st)) if st.size else None,
        step_time_p90_s=float(np.percentile(st, 90)) if st.size else None,
        mfu=mfu, hfu=hfu, mfu_note=mfu_note,
        mem_peak_bytes=float(mem.max()) if mem.size else None,
        mem_source=str((meta.environment if meta else {}).get("mem_source", "not recorded")),
        data_wait_frac=_share(steady, "data_wait_s", total),
        comm_frac=_share(steady, "comm_s", total),
        comm_exposed_frac=_share(steady, "comm_exposed_s", total),
        phase_frac=phase_frac, phase_source=phase_source,
        skipped_records=int(skipped_records), notes=notes,
        per_rank=_rank_lines(steady) if ranks > 1 else [],
    )
