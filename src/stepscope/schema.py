"""The two tables every analysis reads, and the run metadata.

*Step table*: one row per (rank, step). Columns are numpy arrays; units are in the names.
*Event table*: one row per profiler-trace event, also columnar.
*Run metadata*: identity, the baseline fingerprint (the variables a one-variable A/B must hold
fixed, after the field report's list) and the environment.

Missing numbers are NaN (floats) so that every column is a plain float64/int64 array and
analyses never meet ``None`` in a hot path. A NaN the training itself produced (a NaN loss)
is kept apart from "not recorded": readers add a flag column ``<column>_nan`` (1.0 where
the record held an explicit NaN), created only when there is one.

Example::

    from stepscope.schema import StepTable
    t = StepTable.from_columns({"rank": [0, 0], "step": [1, 2], "step_time_s": [0.5, 0.4]})
    t["step_time_s"].mean()          # 0.45
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ._fastnp import is_ordered, unique_ints

__all__ = [
    "AnyArray",
    "Column",
    "STEP_COLUMNS",
    "STEP_COLUMN_NAMES",
    "BETWEEN_STEP_COLUMNS",
    "NAN_MEANINGFUL",
    "NAN_MEANS_MISSING",
    "PHASES",
    "StepTable",
    "EVENT_KINDS",
    "EventTable",
    "BASELINE_FIELDS",
    "ENVIRONMENT_FIELDS",
    "RunMeta",
    "eval_record",
]

AnyArray = npt.NDArray[Any]
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Column:
    """One column of a table: name (with unit), numpy dtype, and what it holds."""

    name: str
    dtype: str
    doc: str


# The step table. Times are seconds of wall clock on the recording rank. A phase time is
# host time unless the row's ``synced`` flag is 1, in which case the device was synchronised
# at each phase boundary (see recorder.Recorder for what the numbers mean in each mode).
STEP_COLUMNS: tuple[Column, ...] = (
    Column("rank", "int64", "global rank of the process that recorded the row"),
    Column("step", "int64", "optimizer step index (one optimizer step = one training step)"),
    Column("end_s", "float64", "step end, seconds since the recorder started (its clock)"),
    Column("wall_time_s", "float64", "step end, UNIX epoch seconds (cross-rank alignment)"),
    Column("step_time_s", "float64", "wall time of the step, including data wait (not the "
           "evaluation or checkpoint saves before it: eval_s, checkpoint_s)"),
    Column("data_wait_s", "float64", "time blocked waiting for the next batch"),
    Column("forward_s", "float64", "forward phase time"),
    Column("backward_s", "float64", "backward phase time"),
    Column("optimizer_s", "float64", "optimizer (update) phase time"),
    Column("comm_s", "float64", "communication time (e.g. gradient all-reduce), total"),
    Column("comm_exposed_s", "float64", "communication time not overlapped by compute"),
    Column("tokens", "float64", "tokens processed in the step (summed over micro-batches)"),
    Column("samples", "float64", "samples (sequences) processed in the step"),
    Column("loss", "float64", "training loss reported for the step"),
    Column("accuracy", "float64", "training accuracy reported for the step (0..1)"),
    Column("lr", "float64", "learning rate of the first parameter group"),
    Column("grad_norm", "float64", "global gradient L2 norm (before clipping)"),
    Column("loss_scale", "float64", "dynamic loss scale (fp16 mixed precision)"),
    Column("overflow", "float64", "1 if the step was skipped for inf/NaN gradients, else 0"),
    Column("mem_peak_bytes", "float64", "peak memory during the step (source in run.json)"),
    Column("mem_alloc_bytes", "float64", "memory in use at step end (source in run.json)"),
    Column("synced", "float64", "1 if phase times were measured with device sync, else 0"),
    Column("cpu_s", "float64", "process CPU time (all threads) between step ends"),
    Column("preempt", "float64", "involuntary context switches of the process between step "
           "ends: the kernel took the CPU away (contention), unlike waiting or sleeping"),
    Column("tool_s", "float64", "time stepscope itself spent in or just before the step "
           "(profiler start/stop, cross-rank gathers): rules never blame training for it"),
    Column("eval_s", "float64", "time between the previous step and this one spent evaluating "
           "(no-grad or eval-mode forwards of the trained model, their data fetches); not in "
           "step_time_s"),
    Column("checkpoint_s", "float64", "time between the previous step and this one spent "
           "saving checkpoints (torch.save); not in step_time_s"),
)
# Time between two steps that is neither training nor stepscope's own: a gap between step
# ends that these columns explain is not a stall.
BETWEEN_STEP_COLUMNS: tuple[str, ...] = ("eval_s", "checkpoint_s")
STEP_COLUMN_NAMES: tuple[str, ...] = tuple(c.name for c in STEP_COLUMNS)
# Columns where the training itself can produce a NaN (a diverged loss, a NaN gradient).
# Everywhere else -- counts, times, lr, loss scale, memory -- NaN can only mean "not known",
# and writers treat it as not recorded. User metrics (extra columns) keep their NaNs.
NAN_MEANINGFUL: frozenset[str] = frozenset({"loss", "accuracy", "grad_norm"})
NAN_MEANS_MISSING: frozenset[str] = frozenset(STEP_COLUMN_NAMES) - NAN_MEANINGFUL
_STEP_DTYPES = {c.name: c.dtype for c in STEP_COLUMNS}

# Named phases of a step, in display order. "other" = step_time_s minus the rest.
PHASES: tuple[str, ...] = ("data_wait", "forward", "backward", "comm_exposed", "optimizer")


def _as_column(name: str, values: Iterable[Any] | AnyArray) -> AnyArray:
    dtype = _STEP_DTYPES.get(name, "float64")
    arr = np.asarray(values if isinstance(values, np.ndarray) else list(values))
    if dtype == "int64":
        return arr.astype(np.int64, copy=False)
    return arr.astype(np.float64, copy=False)


def _never_recorded(n: int) -> AnyArray:
    return np.broadcast_to(np.float64(np.nan), (n,))


def _is_never_recorded(arr: AnyArray) -> bool:
    return arr.ndim == 1 and arr.strides == (0,) and arr.size > 0 and bool(np.isnan(arr[0]))


class _Selected(Mapping[str, AnyArray]):
    """The columns of ``base`` at rows ``index``, each taken on first access and kept.

    A column never recorded (one shared NaN) stays one: it is not copied per row."""

    __slots__ = ("base", "index", "_taken")

    def __init__(self, base: Mapping[str, AnyArray], index: AnyArray) -> None:
        self.base = base
        self.index = index
        self._taken: dict[str, AnyArray] = {}

    def __getitem__(self, name: str) -> AnyArray:
        got = self._taken.get(name)
        if got is None:
            col = self.base[name]
            if name in _STEP_DTYPES and _is_never_recorded(col):
                got = _never_recorded(self.index.size)
            else:
                got = col[self.index]
            self._taken[name] = got
        return got

    def __iter__(self) -> Iterator[str]:
        return iter(self.base)

    def __len__(self) -> int:
        return len(self.base)

    def __contains__(self, name: object) -> bool:
        return name in self.base


class StepTable:
    """Columnar step table: ``name -> 1-D numpy array``, all the same length.

    Known columns (``STEP_COLUMNS``) are always present (NaN-filled when never recorded);
    user metrics logged under other names are extra float64 columns. Instances are
    treated as immutable: methods return new tables and never modify arrays in place.
    """

    __slots__ = ("_cols", "_n", "__weakref__")
    _cols: Mapping[str, AnyArray]

    def __init__(self, columns: Mapping[str, AnyArray]) -> None:
        n = len(next(iter(columns.values()))) if columns else 0
        cols: dict[str, AnyArray] = {}
        for c in STEP_COLUMNS:
            if c.name in columns:
                cols[c.name] = _as_column(c.name, columns[c.name])
            elif c.dtype == "int64":
                cols[c.name] = np.zeros(n, dtype=np.int64)
            else:  # one shared read-only NaN for a column never recorded: no n x 8 bytes
                cols[c.name] = _never_recorded(n)
        for name, arr in columns.items():
            if name not in cols:
                cols[name] = _as_column(name, arr)
        for name, arr in cols.items():
            if arr.shape != (n,):
                raise ValueError(f"column {name!r} has shape {arr.shape}, expected ({n},)")
        self._cols = cols
        self._n = n

    @classmethod
    def from_columns(cls, columns: Mapping[str, Sequence[Any] | AnyArray]) -> StepTable:
        return cls({k: _as_column(k, v) for k, v in columns.items()})

    @classmethod
    def empty(cls) -> StepTable:
        return cls({c.name: np.zeros(0, dtype=c.dtype) for c in STEP_COLUMNS})

    @classmethod
    def concat(cls, tables: Sequence[StepTable]) -> StepTable:
        """Stack tables (e.g. one per rank); extra columns missing in a part are NaN."""
        tables = [t for t in tables if len(t)]
        if not tables:
            return cls.empty()
        names: dict[str, None] = {}
        for t in tables:
            names.update(dict.fromkeys(t.columns))
        out = {}
        for name in names:
            if name in _STEP_DTYPES and all(
                    _is_never_recorded(t._cols[name]) for t in tables if name in t._cols):
                continue  # filled (without memory) by the constructor
            parts = [t._cols[name] if name in t._cols else np.full(len(t), np.nan)
                     for t in tables]
            out[name] = np.concatenate(parts)
        return cls(out)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, name: str) -> AnyArray:
        return self._cols[name]

    def __contains__(self, name: object) -> bool:
        return name in self._cols

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(self._cols)

    @property
    def extra_columns(self) -> tuple[str, ...]:
        return tuple(n for n in self._cols if n not in _STEP_DTYPES)

    def has_data(self, name: str) -> bool:
        """True when the column exists and holds at least one finite value."""
        if name not in self._cols:
            return False
        cols = self._cols
        if isinstance(cols, _Selected) and name not in cols._taken:  # probe, no copy yet
            base = cols.base[name]
            if _is_never_recorded(base) or np.isfinite(base[cols.index[:4096]]).any():
                return not _is_never_recorded(base)
        arr = cols[name]
        if not arr.size or _is_never_recorded(arr):
            return False
        # A column with data almost always has it in its first rows: checked first, so
        # the 60-odd asks of one command do not each scan millions of rows.
        return bool(np.isfinite(arr[:4096]).any()) or bool(np.isfinite(arr[4096:]).any())

    def select(self, mask: AnyArray) -> StepTable:
        """Rows where ``mask`` (bool array or index array) selects.

        Columns are taken when first read (see :class:`_Selected`): analyses select steady
        rows of a 10-million-row table many times and read a few columns of each."""
        cols = self._cols
        if isinstance(cols, _Selected):
            base, idx = cols.base, cols.index[mask]
        else:
            base, m = cols, np.asarray(mask)
            if m.dtype == np.bool_ and m.shape != (self._n,):
                raise IndexError(f"boolean mask of shape {m.shape} for a table of "
                                 f"{self._n} rows")
            idx = np.flatnonzero(m) if m.dtype == np.bool_ else m.astype(np.int64)
        out = StepTable.__new__(StepTable)
        out._cols = _Selected(base, idx)
        out._n = int(idx.size)
        return out

    def rank(self, rank: int) -> StepTable:
        return self.select(self._cols["rank"] == rank)

    def ranks(self) -> list[int]:
        return [int(r) for r in unique_ints(self._cols["rank"])]

    def sorted(self) -> StepTable:
        """Rows ordered by (rank, step)."""
        rank, step = self._cols["rank"], self._cols["step"]
        if is_ordered(rank, step):
            return self  # already ordered (the store's tables are): no sort, no copy
        order = np.lexsort((step, rank))
        return self.select(order)

    def to_dict(self) -> dict[str, list[Any]]:
        return {k: v.tolist() for k, v in self._cols.items()}


# Event table kinds. "step" rows are step markers (ProfilerStep#N), "phase" rows are phase
# annotations (forward/backward/optimizer/data); the rest are device or host activity.
EVENT_KINDS: tuple[str, ...] = ("compute", "comm", "memcpy", "data", "cpu", "step", "phase")


@dataclass
class EventTable:
    """Columnar trace-event table, one row per event.

    ``kind`` holds indices into ``EVENT_KINDS``; ``name`` holds indices into ``names``
    (a string table shared by all rows, so no per-event Python string is kept).
    Times are microseconds (float64, so ns-resolution traces keep their precision).
    ``stream`` is the device stream id, or the host thread id for host events.
    ``step`` is the ProfilerStep index the event falls in, -1 when outside any step.
    ``extra`` holds reader-specific columns of the same length (e.g. ``launch_us``:
    start of the host launch of a device kernel, NaN when not correlated).
    """

    rank: IntArray
    kind: npt.NDArray[np.int8]
    name: IntArray
    start_us: FloatArray
    dur_us: FloatArray
    stream: IntArray
    step: IntArray
    names: list[str]
    extra: dict[str, AnyArray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.start_us.shape[0])

    @property
    def end_us(self) -> FloatArray:
        return self.start_us + self.dur_us

    def kind_mask(self, kind: str) -> npt.NDArray[np.bool_]:
        return np.asarray(self.kind == EVENT_KINDS.index(kind), dtype=bool)

    def name_of(self, i: int) -> str:
        return self.names[int(self.name[i])]

    def select(self, mask: AnyArray) -> EventTable:
        return EventTable(
            rank=self.rank[mask], kind=self.kind[mask], name=self.name[mask],
            start_us=self.start_us[mask], dur_us=self.dur_us[mask],
            stream=self.stream[mask], step=self.step[mask], names=self.names,
            extra={k: v[mask] for k, v in self.extra.items()}, meta=dict(self.meta),
        )


# Baseline fingerprint: the variables a one-variable A/B comparison must hold fixed.
# After the field report's list: model, data, devices/parallelism, batch, optimizer schedule,
# precision, recompute, seed. Unknown values are simply absent from run.json.
BASELINE_FIELDS: dict[str, str] = {
    "model_name": "model name or architecture",
    "model_structure_hash": "hash of the module tree (names, shapes, dtypes)",
    "num_params": "parameter count",
    "num_layers": "transformer layers",
    "hidden_size": "model width",
    "num_heads": "attention heads",
    "seq_len": "sequence length (tokens per sample)",
    "vocab_size": "vocabulary size",
    "dataset": "dataset name or path",
    "dataset_version": "dataset version / hash",
    "num_samples": "dataset sample count",
    "packing": "sequence packing on/off or method",
    "shuffle": "data shuffling on/off",
    "num_devices": "device (card) count of the job",
    "device_kind": "accelerator kind (e.g. 'NVIDIA H100 80GB HBM3', 'cpu')",
    "parallel_strategy": "e.g. 'ddp', 'fsdp', 'data_parallel', 'semi_auto_parallel'",
    "dp": "data-parallel degree",
    "tp": "tensor-parallel degree",
    "pp": "pipeline-parallel degree",
    "zero_stage": "optimizer/gradient/parameter sharding stage (0..3)",
    "global_batch": "samples per optimizer step over all ranks",
    "micro_batch": "samples per forward pass per rank",
    "grad_accum": "gradient accumulation steps",
    "optimizer": "optimizer name",
    "lr": "peak learning rate",
    "warmup_steps": "warm-up steps",
    "lr_schedule": "schedule name",
    "weight_decay": "weight decay",
    "precision": "fp32 | bf16 | fp16-mixed | bf16-mixed ...",
    "recompute": "none | selective | full",
    "seed": "random seed",
}

ENVIRONMENT_FIELDS: dict[str, str] = {
    "framework": "torch | mindspore | none",
    "framework_version": "framework version string",
    "stepscope_version": "stepscope version",
    "python_version": "Python version",
    "hostname": "host that wrote rank 0",
    "platform": "OS / machine",
    "code_commit": "git commit of the training code, when it is a git checkout",
    "code_dirty": "whether the training code had uncommitted changes",
    "device_name": "device name as the framework reports it",
    "driver_version": "accelerator driver / CUDA / CANN version",
    "mem_source": "what mem_peak_bytes measures (e.g. 'cuda max_memory_allocated')",
    "peak_flops_per_device": "dense peak FLOP/s per device used for MFU",
    "peak_flops_source": "where that peak comes from",
    "flops_per_token": "model FLOPs per token used for MFU",
    "hardware_flops_per_token": "hardware FLOPs per token (with recompute) used for HFU",
    "flops_convention": "FLOPs convention name",
}


@dataclass
class RunMeta:
    """Contents of run.json: identity, baseline fingerprint, environment, status."""

    run_id: str
    name: str = ""
    created_utc: str = ""
    status: str = "running"  # running | finished | failed
    error: str | None = None
    command: list[str] | None = None
    baseline: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    schema_version: int = 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunMeta:
        known = {f.name for f in dataclasses.fields(cls)}
        if "run_id" not in d:
            raise ValueError("run.json has no 'run_id'")
        return cls(**{k: v for k, v in d.items() if k in known})


def eval_record(step: int, metrics: Mapping[str, float],
                tokens: float | None = None) -> dict[str, Any]:
    """The event ``RunDir.append_event`` stores for one evaluation (validated).

    Example::

        run.append_event(eval_record(1000, {"val_loss": 2.31}))
    """
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"eval step must be a non-negative integer, got {step!r}")
    clean: dict[str, float] = {}
    for name, value in metrics.items():
        v = float(value)
        if not name or not math.isfinite(v):
            raise ValueError(f"eval metric {name!r}={value!r}: expected a name and a "
                             "finite number")
        clean[name] = v
    if not clean:
        raise ValueError("an eval record needs at least one metric")
    rec: dict[str, Any] = {"type": "eval", "step": step, "metrics": clean}
    if tokens is not None:
        rec["tokens"] = float(tokens)
    return rec
