"""Steps and phases for MindSpore traces that carry neither (the CPU profiler).

Pure functions over an :class:`EventTable`; they return a new table and never modify theirs.

Phases from op names. In GRAPH mode MindSpore names each op by the cell scope it came from:
``Default/network-WithLossCell/...`` (forward), ``Gradients/Default/...`` (backward),
``Default/optimizer-<Name>/...`` (update), ``.../AllReduce-op0`` (communication). The rules
(``PHASE_RULES``, first match wins) were read off real MindSpore 2.10 CPU output
(../shared/data/traces/mindspore-cpu and profiles made by tests/scripts/ms_*.py). Ops without a
scope (``Expand/_MatMulExt/...``: pieces of an expanded composite op) take the phase of the op
that ran just before them. PyNative names are flat ("MatMul", "Default/Conv2D-op0"): without
marks only the few gradient-named ops ("ReluGrad") anchor a guess, said so in the source.

Phases from stepscope's marks. PyNative names are flat, so a PyNative capture hooks the
network and optimizer (``integrations/mindspore/marks.py``) and writes the phase windows
beside the profile; when present they decide the phase of every op of the steps they cover
(an op takes the window its start falls in; between windows: "other"; collectives: comm).
Between the network's forward end and its backward begin the loss function runs, then its
gradient: that window is cut at the gradient seed op (``GRAD_SEED_OP_TYPES``).

Steps. stepscope's own capture writes the step windows it timed beside the profile
(``stepscope_steps.json``, epoch microseconds): those are used when present. Otherwise a
graph runs each op once per step, so the step count is the most common occurrence count of
an op name, and each step starts where the earliest op with that count starts again.

The result has ``step`` rows (name ``Step#N``), ``phase`` rows (one per run of consecutive
ops of one phase, named ``forward``/``backward``/``optimizer``), the per-row column
``extra["phase"]`` (index into ``meta["phase_names"]``, -1 on step/phase rows) and
``meta["step_source"]``, ``meta["phase_source"]``, ``meta["warnings"]``.

Example::

    table = annotate(raw_table, markers=None)
    table.meta["phase_source"]   # 'inferred from op names (graph-mode scopes)'
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..schema import EVENT_KINDS, EventTable

Arr = npt.NDArray[Any]

__all__ = ["PHASE_NAMES", "PHASE_RULES", "MARKERS_FILE", "GRAD_SEED_OP_TYPES", "op_phase",
           "op_type",
           "is_comm_op", "annotate", "phase_busy_us"]

MARKERS_FILE = "stepscope_steps.json"
PHASE_NAMES: tuple[str, ...] = ("forward", "backward", "optimizer", "comm", "other")
_FWD, _BWD, _OPT, _COMM, _OTHER = range(5)
_UNKNOWN = -1
_FLAT = -2  # "Default/<Op>-opN": a jit-compiled function's op, no cell scope

# Collective primitives of mindspore.ops (communication operators) and HCCL kernel prefix.
COMM_OP_TYPES: frozenset[str] = frozenset({
    "AllReduce", "AllGather", "AllGatherV", "ReduceScatter", "ReduceScatterV", "AlltoAll",
    "AlltoAllV", "Broadcast", "Send", "Receive", "Recv", "NeighborExchange",
    "NeighborExchangeV2", "CollectiveScatter", "CollectiveGather", "Barrier",
    "BatchISendIRecv", "DistCommAllReduce", "DistCommAllGather",
})
# Update primitives used by mindspore.nn optimizers (nn/optim/*.py), for jit-compiled
# custom loops where the optimizer graph has no "optimizer-" scope. AssignAdd is the
# optimizer's global-step counter there (Default/AssignAdd-opN in the update graph).
OPTIMIZER_OP_TYPES: frozenset[str] = frozenset({
    "Adam", "AdamWeightDecay", "AdamW", "ApplyAdam", "ApplyAdamWithAmsgradV2", "ApplyMomentum",
    "SGD", "ApplyRMSProp", "ApplyCenteredRMSProp", "ApplyAdagrad", "ApplyAdagradV2",
    "ApplyAdadelta", "ApplyAdaMax", "ApplyProximalAdagrad", "FusedSparseAdam", "Lamb",
    "LARSUpdate", "ApplyFtrl", "AssignAdd",
})
_OP_SUFFIX = re.compile(r"-op\d+$")

# (phase, pattern) on the full op name, first match wins (see the module docstring).
PHASE_RULES: tuple[tuple[int, re.Pattern[str]], ...] = (
    (_OPT, re.compile(r"(?:^|/)optimizer-|(?:^|/)optimizer/", re.IGNORECASE)),
    (_BWD, re.compile(r"^Gradients/|(?:^|/)grad_reducer-")),
    (_FLAT, re.compile(r"^Default/[^/]+$")),
    (_FWD, re.compile(r"^Default/")),
    (_BWD, re.compile(r"Backward|Grad")),  # unscoped pieces of backward composites
)


def op_type(name: str) -> str:
    """The primitive of a MindSpore op name: its last path part without ``-opN``
    (``Gradients/Default/.../Conv2DBackpropFilter-op3`` -> ``Conv2DBackpropFilter``)."""
    return _OP_SUFFIX.sub("", name.rsplit("/", 1)[-1])


_op_type = op_type


def is_comm_op(name: str) -> bool:
    """True for collective ops (``.../AllReduce-op0``, ``hcom_allReduce_...``)."""
    return _op_type(name) in COMM_OP_TYPES or name.lower().startswith("hcom_")


def op_phase(name: str) -> int:
    """Phase index (into PHASE_NAMES) of one op name; -1 when the name has no scope, -2
    for a flat ``Default/<Op>`` name (resolved by position, see ``_resolve_flat``)."""
    if is_comm_op(name):
        return _COMM
    for phase, pattern in PHASE_RULES:
        if pattern.search(name):
            if phase in (_FWD, _FLAT) and _op_type(name) in OPTIMIZER_OP_TYPES:
                return _OPT
            return phase
    return _UNKNOWN


def _fill_unknown(codes: Arr) -> tuple[Arr, int]:
    """Unknown codes (-1), in time order, take the previous known code (the first known one
    at the start); returns the filled codes and how many were filled."""
    unknown = codes == _UNKNOWN
    n = int(unknown.sum())
    if not n or n == codes.size:
        return np.where(unknown, _OTHER, codes), n
    idx = np.where(~unknown, np.arange(codes.size), 0)
    np.maximum.accumulate(idx, out=idx)
    filled = codes[idx]
    first_known = int(np.argmax(~unknown))
    filled[:first_known] = codes[first_known]
    return filled, n


def _resolve_flat(codes: Arr, step: Arr, start: Arr) -> Arr:
    """Flat ``Default/<Op>`` ops (functions compiled with ``mindspore.jit`` have no cell
    scope): forward when they run before the step's first backward op, else unscoped
    (they then follow the op before them: loss-scale unscaling after the backward, ...)."""
    out = codes.copy()
    flat = codes == _FLAT
    if not flat.any():
        return out
    keys, inv = np.unique(step, return_inverse=True)
    first_bwd = np.full(keys.size, np.inf)
    bwd = codes == _BWD
    np.minimum.at(first_bwd, inv[bwd], start[bwd])
    limit = first_bwd[inv]
    # A step with no backward-scoped op at all gives no basis: PyNative names look like
    # this ("Default/Conv2D-op0", "Default/Conv2DBackpropFilter-op0") and were all
    # called forward before (the field report's "forward 62.8 ms" for 26 ms).
    out[flat & (start < limit)] = _FWD
    out[flat & ((start >= limit) | ~np.isfinite(limit))] = _UNKNOWN
    return out


def _steps_from_markers(start_abs: Arr, markers: Sequence[dict[str, Any]]) -> Arr:
    step = np.full(start_abs.size, -1, dtype=np.int64)
    for m in sorted(markers, key=lambda m: float(m["start_us"])):
        inside = (start_abs >= float(m["start_us"])) & (start_abs <= float(m["end_us"]))
        step[inside] = int(m["step"])
    return step


def _steps_from_repetition(name: Arr, start: Arr) -> tuple[Arr, int]:
    """Step index per op from repetition (see module docstring); -1 everywhere if unclear."""
    counts = np.bincount(name)
    present = counts[counts > 0]
    n_steps = int(np.bincount(present).argmax()) if present.size else 0
    if n_steps < 1:
        return np.full(name.size, -1, dtype=np.int64), 0
    order = np.argsort(start, kind="stable")
    anchor = next(int(name[i]) for i in order if counts[name[i]] == n_steps)
    bounds = np.sort(start[name == anchor])
    step = np.searchsorted(bounds, start, side="right").astype(np.int64) - 1
    return np.maximum(step, 0), n_steps


def _run_rows(start: Arr, end: Arr, phase: Arr,
              step: Arr) -> list[tuple[int, float, float, int]]:
    """(phase, start, end, step) of each run of consecutive same-phase ops within a step."""
    rows: list[tuple[int, float, float, int]] = []
    order = np.lexsort((start, step))
    if not order.size:
        return rows
    p, s, e, k = phase[order], start[order], end[order], step[order]
    cut = np.flatnonzero((p[1:] != p[:-1]) | (k[1:] != k[:-1])) + 1
    for a, b in zip(np.r_[0, cut], np.r_[cut, p.size], strict=False):
        if p[a] in (_FWD, _BWD, _OPT):
            rows.append((int(p[a]), float(s[a]), float(e[a:b].max()), int(k[a])))
    return rows


def _step_spans(start: Arr, end: Arr, step: Arr) -> tuple[list[int], list[float], list[float]]:
    """(step, first start, last end) of each step present."""
    keys, inv = np.unique(step, return_inverse=True)
    lo, hi = np.full(keys.size, np.inf), np.full(keys.size, -np.inf)
    np.minimum.at(lo, inv, start)
    np.maximum.at(hi, inv, end)
    return keys.tolist(), lo.tolist(), hi.tolist()


def _append_rows(t: EventTable, rows: list[tuple[str, str, float, float, int]],
                 phase: Arr) -> EventTable:
    """New table = ``t`` + rows (kind, name, start, end, step), sorted by start."""
    names = list(t.names)
    index = {n: i for i, n in enumerate(names)}
    for _, nm, _, _, _ in rows:
        if nm not in index:
            index[nm] = len(names)
            names.append(nm)
    k = len(rows)
    extra = {key: np.r_[col, np.full(k, np.nan)] for key, col in t.extra.items()}
    extra["phase"] = np.r_[phase.astype(np.float64), np.full(k, -1.0)]
    out = EventTable(
        rank=np.r_[t.rank, np.full(k, t.rank[0] if len(t) else 0)].astype(np.int64),
        kind=np.r_[t.kind, [EVENT_KINDS.index(r[0]) for r in rows]].astype(np.int8),
        name=np.r_[t.name, [index[r[1]] for r in rows]].astype(np.int64),
        start_us=np.r_[t.start_us, [r[2] for r in rows]].astype(np.float64),
        dur_us=np.r_[t.dur_us, [r[3] - r[2] for r in rows]].astype(np.float64),
        stream=np.r_[t.stream, np.full(k, -1)].astype(np.int64),
        step=np.r_[t.step, [r[4] for r in rows]].astype(np.int64),
        names=names, extra=extra, meta=dict(t.meta),
    )
    return out.select(np.argsort(out.start_us, kind="stable"))


def _assign_steps(t: EventTable, ops: Arr,
                  markers: Sequence[dict[str, Any]] | None) -> tuple[Arr, str]:
    if (t.step[ops] >= 0).any():
        return t.step.copy(), "Step Id column of the profiler output"
    step = t.step.copy()
    if markers:
        origin = float(t.meta.get("time_origin_us", 0))
        step[ops] = _steps_from_markers(t.start_us[ops] + origin, markers)
        return step, f"stepscope step markers ({MARKERS_FILE})"
    step[ops], n = _steps_from_repetition(t.name[ops], t.start_us[ops])
    if n < 1:
        return step, "none: no step markers and no repeating op pattern"
    return step, (f"inferred: {n} steps from op repetition (no step markers on CPU); "
                  "each step starts where the first once-per-step op starts again")


# The ops value_and_grad / GradOperation start a backward with: the gradient seed
# ones_like(loss) (MindSpore 2.10 CPU PyNative writes "OnesLike" or "Ones").
GRAD_SEED_OP_TYPES: frozenset[str] = frozenset({"OnesLike", "Ones", "Fill", "FillV2"})
_LOSS = -3  # the window between the network's forward end and its backward begin


def _phases_from_marks(start_abs: Arr, step: Arr, types: Arr,
                       marks: Sequence[dict[str, Any]]) -> tuple[Arr, Arr]:
    """(covered, code) per op from stepscope's phase windows (epoch us): ops of a step that
    has windows take the phase of the window their start falls in, else "other". A loss
    window (the loss function, then its gradient) is forward up to its first gradient-seed
    op and backward from it (all forward when it has none)."""
    names = {n: i for i, n in enumerate(PHASE_NAMES)}
    names["loss"] = _LOSS
    rows = sorted((float(m["start_us"]), float(m["end_us"]), names[str(m["name"])])
                  for m in marks if str(m.get("name")) in names)
    marked_steps = np.unique([int(m["step"]) for m in marks if "step" in m])
    covered = np.isin(step, marked_steps)
    code = np.full(start_abs.size, _OTHER, dtype=np.int64)
    if not rows:
        return covered, code
    ws, we, wp = (np.asarray(c) for c in zip(*rows, strict=True))
    i = np.searchsorted(ws, start_abs, side="right") - 1
    inside = (i >= 0) & (start_abs <= we[np.maximum(i, 0)])
    code[inside] = wp[i[inside]]
    seed = np.isin(types, list(GRAD_SEED_OP_TYPES))
    for w in np.flatnonzero(wp == _LOSS):
        in_w = inside & (i == w)
        seeds = start_abs[in_w & seed]
        cut = seeds.min() if seeds.size else np.inf
        code[in_w] = np.where(start_abs[in_w] >= cut, _BWD, _FWD)
    return covered, code


def _name_phases(codes: Arr, ops: Arr, order: Arr,
                 warnings: list[str]) -> tuple[Arr, str]:
    """Phase per row from op names (graph-mode scopes; see the module docstring)."""
    scoped = int((codes[ops] != _UNKNOWN).sum())
    filled = codes.copy()
    filled[order], n_filled = _fill_unknown(codes[order])
    if ops.any() and scoped == 0:
        filled[:] = _OTHER
        warnings.append("no forward/backward/optimizer split: op names have no graph scope")
        return filled, ("none: op names carry no scope (PyNative mode?), no phase split; "
                        "a capture by stepscope (profile_steps) marks the phases")
    return filled, ("inferred from op names (graph-mode scopes); "
                    f"{n_filled} unscoped ops took the phase of the op before them")


def annotate(t: EventTable, markers: Sequence[dict[str, Any]] | None = None,
             phase_marks: Sequence[dict[str, Any]] | None = None) -> EventTable:
    """Add steps, phase codes, step rows and phase rows to a MindSpore op table.

    ``phase_marks``: stepscope's phase windows (``{"step", "name", "start_us", "end_us"}``,
    epoch us), written during a PyNative capture; they replace the op-name rules for the
    steps they cover.
    """
    ops = np.isin(t.kind, [EVENT_KINDS.index("compute"), EVENT_KINDS.index("comm")])
    warnings: list[str] = list(t.meta.get("warnings", []))
    name_phase = np.array([op_phase(n) for n in t.names], dtype=np.int64)
    codes = name_phase[t.name] if len(t) else np.zeros(0, dtype=np.int64)
    step, step_source = _assign_steps(t, ops, markers)
    codes = _resolve_flat(codes, step, t.start_us)
    order = np.argsort(t.start_us, kind="stable")
    if phase_marks:
        origin = float(t.meta.get("time_origin_us", 0))
        types = np.array([_op_type(n) for n in t.names], dtype=object)
        covered, marked = _phases_from_marks(t.start_us + origin, step,
                                             types[t.name] if len(t) else types, phase_marks)
        covered &= ops
        filled = np.where(covered, marked, _OTHER)
        if (ops & ~covered).any():  # steps without marks (e.g. a @jit step): by name
            by_name, _ = _name_phases(codes, ops, order, [])
            filled = np.where(covered, filled, by_name)
        filled = np.where(codes == _COMM, _COMM, filled)
        in_window = int((covered & (marked != _OTHER)).sum())
        phase_source = (f"stepscope phase marks ({MARKERS_FILE}: network and optimizer "
                        f"hooks, each after a device sync); {in_window} of "
                        f"{int(covered.sum())} marked-step ops fall in a phase window, the "
                        "others (between windows) count as other")
    else:
        filled, phase_source = _name_phases(codes, ops, order, warnings)
    if (step[ops] < 0).any():
        warnings.append(f"{int((step[ops] < 0).sum())} ops fall outside every step")
    if not (t.kind == EVENT_KINDS.index("comm")).any():
        warnings.append("no communication found (looked for: "
                        + ", ".join(sorted(COMM_OP_TYPES)) + ", hcom_*)")
    base = EventTable(t.rank, t.kind, t.name, t.start_us, t.dur_us, t.stream, step,
                      t.names, dict(t.extra), dict(t.meta))
    rows: list[tuple[str, str, float, float, int]] = []
    in_step = ops & (step >= 0)
    for k, s, e in zip(*_step_spans(t.start_us[in_step], (t.start_us + t.dur_us)[in_step],
                                    step[in_step]), strict=True):
        rows.append(("step", f"Step#{k}", s, e, k))
    for p, s, e, k in _run_rows(t.start_us[in_step], (t.start_us + t.dur_us)[in_step],
                                filled[in_step], step[in_step]):
        rows.append(("phase", PHASE_NAMES[p], s, e, k))
    out = _append_rows(base, rows, np.where(ops, filled, -1))
    out.meta.update(phase_names=list(PHASE_NAMES), phase_source=phase_source,
                    step_source=step_source, warnings=warnings)
    return out


def phase_busy_us(t: EventTable) -> dict[int, dict[str, float]]:
    """Per step: summed op time per phase (µs, ops only) and the step's span ("step").

    Busy time counts each op once; CPU ops of one graph run one at a time, so on CPU the
    sum is also the wall time covered. Gaps between ops (host dispatch) are in ``step``
    but in no phase.
    """
    if "phase" not in t.extra:
        return {}
    ops = np.isin(t.kind, [EVENT_KINDS.index("compute"), EVENT_KINDS.index("comm")])
    ops &= t.step >= 0
    keys, inv = np.unique(t.step[ops], return_inverse=True)
    busy = np.zeros((keys.size, len(PHASE_NAMES)))
    code = t.extra["phase"][ops].astype(np.int64)
    np.add.at(busy, (inv, code), t.dur_us[ops])
    is_step = t.kind == EVENT_KINDS.index("step")
    span = dict(zip(t.step[is_step].tolist(), t.dur_us[is_step].tolist(), strict=True))
    return {int(k): {**dict(zip(PHASE_NAMES, row.tolist(), strict=True)),
                     "step": span.get(int(k), float("nan"))}
            for k, row in zip(keys, busy, strict=True)}
