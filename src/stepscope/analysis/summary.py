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
* The headline numbers (throughput, step time, MFU, shares) come from the steady-state
  regime (``headline_mask``: warm-up excluded, then the regime of ``analysis.regimes``
  that the environment does not explain); a run with more than one regime names them in
  ``regimes`` and ``notes``.
* Throughput = sum(tokens) / sum(step_time_s) over headline steps, per rank, summed over
  ranks (each data-parallel rank contributes its own tokens).
* MFU = tokens/s x model FLOPs per token / (devices x dense peak FLOP/s per device)
  (PaLM App. B definition); HFU uses hardware FLOPs per token (recompute counted). Both
  need ``flops_per_token`` and ``peak_flops_per_device`` in run.json's environment;
  otherwise they are None and ``mfu_note`` says why.
* Phase shares: device-synced rows when there are any, else all; ``other``: the rest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .._fastnp import LastResult, nansum, unique_ints
from ..schema import BETWEEN_STEP_COLUMNS, AnyArray, RunMeta, StepTable
from ._groups import Groups as _Groups
from .mfu import run_mfu
from .regimes import Regimes, find_regimes

__all__ = ["Sheet", "RankLine", "summarize", "steady_mask", "headline_mask", "Conditions",
           "run_mfu", "throughput", "WARMUP_SLOW_FACTOR", "WARMUP_MAX_FRAC"]

Conditions = Mapping[int, Sequence[Mapping[str, Any]]]  # RunDir.read_conditions(), per rank

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


def steady_mask(table: StepTable) -> AnyArray:
    """Boolean mask of steady-state rows (warm-up excluded per rank; see module doc).

    Per rank ordered by step: the first step always, then leading steps slower than
    ``WARMUP_SLOW_FACTOR`` x the median of the rest (finite values), at most
    ``WARMUP_MAX_FRAC`` of the rank's steps; ranks of two or fewer steps drop one. Never
    steady: profiled steps, steps over half stepscope's own (``tool_s``: a profiler stop).
    Read-only; the last table's mask is reused (the sheet, rules and ledgers all ask).
    """
    tool = table["tool_s"] if table.has_data("tool_s") else None
    prof = table["profiled"] if table.has_data("profiled") else None
    return _STEADY((table["rank"], table["step"], table["step_time_s"]), (tool, prof))


def _steady_mask(rank: AnyArray, step: AnyArray, step_time: AnyArray,
                 tool: AnyArray | None, prof: AnyArray | None) -> AnyArray:
    n_rows = len(rank)
    mask = np.zeros(n_rows, dtype=bool)
    mask.flags.writeable = False
    if not n_rows:
        return mask
    g = _Groups.of(rank, within=step)
    st = step_time[g.order]
    n = g.counts
    ref = g.medians(step_time, skip_first=True)
    pos = np.arange(st.size) - np.repeat(g.starts, n)
    with np.errstate(invalid="ignore"):
        slow = np.isfinite(st) & (st > WARMUP_SLOW_FACTOR * np.repeat(ref, n))
    stop = np.where(~slow & (pos >= 1), pos, np.iinfo(np.int64).max)
    first_fast = np.minimum.reduceat(stop, g.starts)
    cap = np.maximum(1, (n * WARMUP_MAX_FRAC).astype(np.int64))
    k = np.minimum(first_fast, cap)
    k = np.where(np.isfinite(ref), k, 1)  # nothing to compare with: drop the first only
    k = np.where(n <= 2, np.minimum(n - 1, 1), k)
    mask = np.zeros(n_rows, dtype=bool)
    mask[g.order[pos >= np.repeat(k, n)]] = True
    if tool is not None:  # a profiler stop, a gather: stepscope's time, not the run's
        mask &= ~(np.nan_to_num(tool) > 0.5 * step_time)
    if prof is not None:
        mask &= ~(prof == 1)
    mask.flags.writeable = False
    return mask


_STEADY = LastResult(_steady_mask, entries=2)


def headline_mask(table: StepTable, conditions: Conditions | None = None
                  ) -> tuple[AnyArray, Regimes]:
    """Rows the headline numbers use (steady regime of the steady steps), and the regimes.

    Example::

        mask, regimes = headline_mask(table, run.read_conditions())
        regimes.steady_regime.name      # "steps 70-149"

    The last table's result is reused (same table and conditions objects): read-only.
    """
    return _HEADLINE((table,), (conditions,))


def _headline_mask(table: StepTable, conditions: Conditions | None
                   ) -> tuple[AnyArray, Regimes]:
    steady = steady_mask(table)
    regimes = find_regimes(table, steady if steady.any() else np.ones(len(table), bool),
                           conditions)
    mask = steady & regimes.mask(table)
    mask.flags.writeable = False
    return mask, regimes


# Two: compare takes both runs' headline steps for the speed ledger, then again for the
# condition differences (each recomputation is a regime search over every row).
_HEADLINE = LastResult(_headline_mask, entries=2)


def _regime_notes(regimes: Regimes) -> list[str]:
    chosen = regimes.steady_regime
    if len(regimes.regimes) < 2 or chosen is None:
        return []
    parts = [f"{r.name} {r.cause}" + (f" ({r.evidence})" if r.cause != "reference" else "")
             for r in regimes.regimes]
    return [f"{len(regimes.regimes)} regimes: " + "; ".join(parts)
            + f". Headline numbers from the steady-state regime, {chosen.name}"]


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
    # The steady-state regime the headline numbers come from, and every regime (to_dict).
    steady_regime: str | None = None
    regimes: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Sheet:
        """The sheet of ``to_dict`` (e.g. as stored with the run's cache)."""
        return cls(**{**d, "per_rank": [RankLine(**r) for r in d["per_rank"]]})


def _share(table: StepTable, col: str, denom: float) -> float | None:
    if not table.has_data(col) or denom <= 0:
        return None
    return nansum(table[col]) / denom


def _phase_split(steady: StepTable) -> tuple[dict[str, float], str]:
    rows = steady
    # never "exact": MindSpore is asynchronous even on CPU
    source = "host times, no step device-synced (a phase may hold earlier queued work)"
    if steady.has_data("synced") and nansum(steady["synced"]) > 0:
        synced = steady.select(steady["synced"] == 1)
        if not np.all(steady["synced"] == 1):
            rows = synced
            source = f"device-synced steps ({len(synced)} of {len(steady)})"
        else:
            source = "device-synced every step"
    total = nansum(rows["step_time_s"])
    split: dict[str, float] = {}
    for phase, col in _PHASE_COLUMNS.items():
        share = _share(rows, col, total)
        if share is not None:
            split[phase] = share
    comm = None if "comm_exposed" in split else _share(rows, "comm_s", total)  # timed phase
    if comm is not None:  # (with comm_exposed_s, comm_s includes overlapped time)
        split["comm"] = comm
    if split:
        split["other"] = max(0.0, 1.0 - sum(split.values()))
    return split, source


def throughput(steady: StepTable, col: str) -> float | None:
    """The sheet's tokens/s (``col="tokens"``) or samples/s of the ``steady`` rows: the sum
    over ranks of each rank's nansum(col) / nansum(step_time_s) (ranks with time)."""
    if not steady.has_data(col):
        return None
    g = _Groups.of(steady["rank"])
    t = g.sums(steady["step_time_s"])
    per_rank = np.where(t > 0, g.sums(steady[col]) / np.where(t > 0, t, 1.0), 0.0)
    total = float(np.cumsum(per_rank)[-1]) if per_rank.size else 0.0  # sequential, in rank order
    return total or None


def _rank_lines(steady: StepTable) -> list[RankLine]:
    """Per-rank medians and shares; compute = forward + backward (+ fused) + optimizer."""
    g = _Groups.of(steady["rank"])
    st = steady["step_time_s"]
    total = g.finite_sums(st)
    median = g.medians(st)
    tps = g.sums(st)  # throughput per rank divides by nansum(step_time_s) too
    cols: dict[str, tuple[AnyArray, AnyArray]] = {
        c: (g.sums(steady[c]), g.any_finite(steady[c]))
        for c in ("tokens", "data_wait_s", "comm_s", "forward_s", "backward_s",
                  "forward_backward_s", "optimizer_s") if c in steady}
    comp = np.zeros(g.ranks.size)
    any_comp = np.zeros(g.ranks.size, dtype=bool)
    for c in ("forward_s", "backward_s", "forward_backward_s", "optimizer_s"):
        if c in cols:
            comp = comp + np.where(cols[c][1], cols[c][0], 0.0)
            any_comp |= cols[c][1]

    def share(c: str, i: int) -> float | None:
        if c not in cols or not cols[c][1][i] or total[i] <= 0:
            return None
        return float(cols[c][0][i] / total[i])

    out = []
    for i, r in enumerate(g.ranks.tolist()):  # builds the result rows; no array work
        tok = (float(cols["tokens"][0][i] / tps[i]) or None
               if "tokens" in cols and cols["tokens"][1][i] and tps[i] > 0 else None)
        out.append(RankLine(
            rank=int(r), steps=int(g.counts[i]),
            step_time_s=float(median[i]) if np.isfinite(median[i]) else None,
            tokens_per_s=tok, data_wait_frac=share("data_wait_s", i),
            comm_frac=share("comm_s", i),
            compute_frac=(float(comp[i] / total[i]) if any_comp[i] and total[i] > 0
                          else None)))
    return out


def _loss_stats(table: StepTable) -> tuple[float | None, float | None, float | None]:
    if not table.has_data("loss"):
        return None, None, None
    loss, step, rank = table["loss"], table["step"], table["rank"]
    ok = np.flatnonzero(np.isfinite(loss))  # first/last in (step, rank) order, no sort;
    if not ok.size:  # ties keep table order, as a stable sort would
        return None, None, None
    s = step if ok.size == step.size else step[ok]  # every loss finite: no copy of step
    lo, hi = ok[s == s.min()], ok[s == s.max()]
    first, last = lo[np.argmin(rank[lo])], hi[hi.size - 1 - np.argmax(rank[hi][::-1])]
    return float(loss[first]), float(loss[last]), float(loss[ok].min())


def _recording_notes(table: StepTable, meta: RunMeta | None) -> list[str]:
    """What the sheet's numbers mean where a loop departs from the plain one."""
    config = meta.config if meta else {}
    out = [f"{what}: {config[key]}" for key, what in
           (("loss_convention", "loss"), ("step_boundary", "step boundary")) if key in config]
    recur = config.get("between_steps")
    if isinstance(recur, dict) and "from_step" in recur:
        out.append(f"step time from step {recur['from_step']} includes recurring no-grad "
                   "forwards (a rollout or probe before every step), booked apart before it")
    between = {c.removesuffix("_s"): float(np.nansum(table[c])) for c in BETWEEN_STEP_COLUMNS
               if len(table) and table.has_data(c)}
    if any(between.values()):
        out.append("between steps, not in step time: " + ", ".join(
            f"{k} {v:.3g} s" for k, v in between.items() if v))
    return out


def _warmup_steps(table: StepTable, mask: AnyArray) -> int:
    """Steps excluded as warm-up: those before some rank's first steady step (a count of
    steps, not of rows: with N ranks each warm-up step is N rows). Profiled or tool-heavy
    steps later in the run are left out of the steady rows too, but are not warm-up."""
    if not mask.any():
        return 0
    g = _Groups.of(table["rank"], within=table["step"])
    steady = g._ordered(mask)
    seen = np.cumsum(steady)  # steady rows so far; before a rank's first one: its start's
    lead = seen == np.repeat(seen[g.starts] - steady[g.starts], g.counts)
    return int(len(unique_ints(g._ordered(table["step"])[lead]))) if lead.any() else 0


def summarize(table: StepTable, meta: RunMeta | None = None,
              skipped_records: int = 0, conditions: Conditions | None = None) -> Sheet:
    """The sheet of one run (all ranks). Pure: reads the table, returns a ``Sheet``.

    ``conditions`` (``RunDir.read_conditions()``) add evidence to the regimes.
    """
    ranks = len(table.ranks())
    steps = int(len(unique_ints(table["step"]))) if len(table) else 0
    mask = steady_mask(table)
    head, regimes = headline_mask(table, conditions)
    steady = table.select(head) if head.any() else table
    notes: list[str] = []
    if len(table) and not mask.any():
        notes.append("too few steps to exclude warm-up; all steps used")
    notes += _regime_notes(regimes)
    notes.extend(_recording_notes(table, meta))
    st = steady["step_time_s"]
    st = st[np.isfinite(st)]
    total = float(st.sum()) if st.size else 0.0
    tps, sps = throughput(steady, "tokens"), throughput(steady, "samples")
    mfu, hfu, mfu_note = run_mfu(tps, meta, ranks, samples_per_s=sps)
    phase_frac, phase_source = _phase_split(steady) if total else ({}, "no steps")
    first, last, lmin = _loss_stats(table)
    acc = table["accuracy"][np.isfinite(table["accuracy"])] if len(table) else np.array([])
    mem = table["mem_peak_bytes"] if len(table) else np.array([])
    mem = mem[np.isfinite(mem)]
    lm = table.has_data("tokens") or not table.has_data("samples")  # samples only: images
    ppl = math.exp(last) if last is not None and last < 50 and lm else None  # token CE, nats
    return Sheet(
        steps=steps, ranks=ranks, warmup_steps=_warmup_steps(table, mask),
        loss_first=first, loss_last=last, loss_min=lmin, perplexity=ppl,
        accuracy_last=float(acc[-1]) if acc.size else None,
        tokens_per_s=tps, samples_per_s=sps,
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
        steady_regime=regimes.steady_regime.name if regimes.steady_regime else None,
        regimes=[r.to_dict() for r in regimes.regimes],
    )
