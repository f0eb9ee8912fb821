"""One rank's step file (JSONL bytes) to numpy columns: bulk decode, validation per reason.

The store's step reader (:meth:`stepscope.rundir.store.RunDir.read_steps`) runs on this. A file is
cut into ~1 MiB chunks at line ends; each chunk is decoded by msgspec in one call into typed
records (the common case: known columns, numbers only) and stacked into a float matrix. A
chunk that does not fit that shape (a torn or corrupt line, a user metric, a "NaN" string, a
wrong type) is decoded line by line instead, so one bad line costs one chunk's speed, not the
file's. Both paths end in the same vectorised value checks (:data:`VALUE_RULES`), so they
give the same table.

Rules (every reader validates and counts):

* a record needs an integer ``step`` (a bool is not an integer) and, when present, an
  integer ``rank``, both in ``[0, 2**53)``: otherwise the record is skipped;
* a value of a known column must be a number (or "NaN"/"Infinity"/"-Infinity"), finite unless
  the column is one where the training itself produces NaN/inf (``NAN_MEANINGFUL``), not
  negative, and under the column's plausibility bound: otherwise the *value* is dropped (read
  as not recorded) and counted;
* each skipped record and dropped value is counted per reason in :class:`ReadStats`.

Example::

    block, stats = decode_steps(Path("steps/rank-00000.jsonl").read_bytes(), "rank-00000")
    block.cols["step_time_s"]
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import orjson

from ..schema import NAN_MEANINGFUL, STEP_COLUMN_NAMES, AnyArray

__all__ = ["ReadStats", "Block", "VALUE_RULES", "decode_steps", "parse_jsonl", "concat_blocks"]

# Reasons are keyed by text; a crafted file with many distinct column names must not grow
# the dict without bound.
_MAX_REASONS = 64
_MAX_PROBLEMS = 20
# ~1 MiB of lines per msgspec call: small enough that one bad line re-reads little, large
# enough that the per-call overhead is nothing (~2,500 records of ~400 bytes).
CHUNK_BYTES = 1 << 20
# rank and step are held in float64 matrices on the fast path: exact below 2**53.
_INT_LIMIT = 2.0**53


@dataclass
class ReadStats:
    """What a reader skipped or dropped: counts, counts per reason, and the first problems.

    ``skipped``: records not used (torn, corrupt, no integer step, duplicate (rank, step)).
    ``rejected``: single values dropped from otherwise good records (wrong type, not finite,
    negative, implausible). ``reasons``: both, counted per reason.
    """

    records: int = 0
    skipped: int = 0
    torn_tail: int = 0
    files: int = 0
    rejected: int = 0
    duplicates: int = 0
    problems: list[str] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)

    def note(self, problem: str, reason: str = "corrupt record") -> None:
        """One skipped record: counted under ``reason``, ``problem`` kept among the first."""
        self.skipped += 1
        self.count(reason)
        self.problem(problem)

    def count(self, reason: str, n: int = 1) -> None:
        if reason not in self.reasons and len(self.reasons) >= _MAX_REASONS:
            reason = "other"
        self.reasons[reason] = self.reasons.get(reason, 0) + n

    def problem(self, text: str) -> None:
        if len(self.problems) < _MAX_PROBLEMS:
            self.problems.append(text)

    def merge(self, other: ReadStats) -> None:
        for name in ("records", "skipped", "torn_tail", "files", "rejected", "duplicates"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for reason, n in other.reasons.items():
            self.count(reason, n)
        for p in other.problems:
            self.problem(p)

    def summary(self) -> str:
        """One line on what was skipped or dropped, per reason; "" when nothing was."""
        if not self.reasons:
            return ""
        parts = ", ".join(f"{reason} {n}" for reason, n in
                          sorted(self.reasons.items(), key=lambda kv: -kv[1]))
        return (f"step records: {self.records} read from {self.files} file(s), "
                f"{self.skipped} skipped, {self.rejected} value(s) dropped ({parts})")

    def to_dict(self) -> dict[str, Any]:
        return {"records": self.records, "skipped": self.skipped, "torn_tail": self.torn_tail,
                "files": self.files, "rejected": self.rejected, "duplicates": self.duplicates,
                "problems": list(self.problems), "reasons": dict(self.reasons)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReadStats:
        s = cls()
        for k in ("records", "skipped", "torn_tail", "files", "rejected", "duplicates"):
            setattr(s, k, int(d[k]))
        s.problems = [str(p) for p in d["problems"]]
        s.reasons = {str(k): int(v) for k, v in d["reasons"].items()}
        return s


@dataclass(frozen=True)
class _Rule:
    nonneg: bool
    limit: float | None  # largest plausible value (None: no bound)


# Plausibility bounds. A value past them is a writer bug or a crafted file, not a
# measurement: 1e300 tokens once made the run's tokens/s read 1.0.
_DAY_S = 86_400.0
_DURATION = _Rule(True, 30 * _DAY_S)  # one step or phase longer than a month is not real
_COUNT = _Rule(True, 1e12)  # tokens/samples per step: ~1e4x today's largest global batches
_BYTES = _Rule(True, 1e16)  # 10 PB on one device: ~1e5x today's largest accelerator memory
_FLAG = _Rule(True, 1.0)
VALUE_RULES: dict[str, _Rule] = {
    "end_s": _Rule(True, 10 * 365 * _DAY_S),  # seconds since the recorder started
    "wall_time_s": _Rule(True, 1e11),  # UNIX seconds: year ~5100
    "step_time_s": _DURATION, "data_wait_s": _DURATION, "forward_s": _DURATION,
    "backward_s": _DURATION, "optimizer_s": _DURATION, "comm_s": _DURATION,
    "comm_exposed_s": _DURATION, "cpu_s": _DURATION, "tool_s": _DURATION,
    "forward_backward_s": _DURATION,
    "tokens": _COUNT, "samples": _COUNT, "preempt": _COUNT,
    "loss": _Rule(False, None), "accuracy": _Rule(False, None),
    "grad_norm": _Rule(True, None),
    "lr": _Rule(True, 1e3),  # any real learning rate is far below 1e3
    "loss_scale": _Rule(True, 1e38),  # fp16 dynamic scales stay below 2**127
    "overflow": _FLAG, "synced": _FLAG,
    "mem_peak_bytes": _BYTES, "mem_alloc_bytes": _BYTES,
}
_FLOAT_COLS = tuple(c for c in STEP_COLUMN_NAMES if c not in ("rank", "step"))
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}

# The fast path's record: known columns only, numbers only; anything else (null included)
# fails the chunk. A plain ``float`` field with a NaN default decodes ~2x faster than
# ``float | None``.
_FIELDS: list[tuple[str, Any, Any]] = [("rank", int, 0)]
_FIELDS += [(c, float, math.nan) for c in _FLOAT_COLS]
_Record = msgspec.defstruct(
    "_Record", [("step", int), *_FIELDS],
    kw_only=True, forbid_unknown_fields=True, gc=False)
_DECODER = msgspec.json.Decoder(_Record)
_FAST_NAMES = ("step", "rank", *_FLOAT_COLS)


@dataclass
class Block:
    """Decoded rows of one rank file (or part of it), validated, before duplicates merge.

    ``cols``: float64 per column, ``rank`` and ``step`` included (exact below 2**53).
    ``flags``: bool per column that held an explicit "NaN" somewhere.
    """

    n: int
    cols: dict[str, AnyArray]
    flags: dict[str, AnyArray] = field(default_factory=dict)

    def never_recorded(self, name: str) -> bool:
        """A known column of rows none of which recorded it: NaN throughout, no explicit
        "NaN". The step table holds it as one shared NaN; the cache does not store it."""
        return (bool(self.n) and name in _KNOWN_FLOAT and name not in self.flags
                and bool(np.isnan(self.cols[name]).all()))


_KNOWN_FLOAT = frozenset(STEP_COLUMN_NAMES) - {"rank", "step"}


def concat_blocks(blocks: Iterable[Block], consume: bool = False) -> Block:
    """One block of ``blocks``' rows in order (a column missing in a part is NaN there).

    ``consume``: each part's column is dropped from it once copied, so that stacking the
    ranks of a 10-million-row run holds about one table in memory, not two (the parts
    must not be used afterwards)."""
    parts = [b for b in blocks if b.n]
    if not parts:
        return Block(0, {"step": np.zeros(0), "rank": np.zeros(0)})
    if len(parts) == 1:
        return parts[0]
    names = dict.fromkeys(k for b in parts for k in b.cols)
    fnames = dict.fromkeys(k for b in parts for k in b.flags)
    cols = {}
    for k in names:
        cols[k] = np.concatenate([b.cols.get(k, np.full(b.n, np.nan)) for b in parts])
        for b in parts if consume else ():
            b.cols.pop(k, None)
    flags = {k: np.concatenate([b.flags.get(k, np.zeros(b.n, bool)) for b in parts])
             for k in fnames}
    return Block(sum(b.n for b in parts), cols, flags)


# -- JSONL lines (also the events file) -----------------------------------------------------
def parse_jsonl(data: bytes, source: str, stats: ReadStats, first_line: int = 1,
                final: bool = True) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) of each readable line; the rest is counted in ``stats``.

    ``final``: ``data`` ends where the file ends, so an unparsable last line without a
    newline is a torn write (the writer died mid-line), not corruption.
    """
    rows: list[tuple[int, dict[str, Any]]] = []
    lines = data.split(b"\n")
    last = len(lines) - 1
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            if i == last and final:
                stats.torn_tail += 1
                stats.note(f"{source}: torn last line (partial write), skipped",
                           "torn last line")
            else:
                stats.note(f"{source}:{first_line + i}: corrupt record, skipped",
                           "corrupt JSON")
            continue
        if not isinstance(obj, dict):
            stats.note(f"{source}:{first_line + i}: record is not a JSON object, skipped",
                       "not a JSON object")
            continue
        rows.append((first_line + i, obj))
    return rows


# -- step files ----------------------------------------------------------------------------
def decode_steps(data: bytes, source: str, first_line: int = 1, final: bool = True,
                 end: int | None = None) -> tuple[Block, ReadStats]:
    """Validated columns of the step records in ``data`` (whole lines of one rank file).

    ``first_line``: line number of ``data``'s first line in the file (for messages);
    ``final``: see :func:`parse_jsonl`; ``end``: decode ``data[:end]`` only (without
    copying it). Duplicate (rank, step) rows are left in: see
    :func:`stepscope.rundir.steps_table.merge_duplicates`.
    """
    stats = ReadStats()
    stop = len(data) if end is None else end
    if not stop:
        return concat_blocks([]), stats
    view = memoryview(data)  # chunks are decoded from views: no copy of the file's bytes
    blocks = []
    body_end = data.rfind(b"\n", 0, stop) + 1  # a last line without newline is read apart
    for start, cut in _chunks(data, body_end):
        block = _fast(view[start:cut])
        if block is None:
            line = first_line + data.count(b"\n", 0, start)
            block = _slow(data[start:cut], source, stats, line, False)
        blocks.append(block)
    if data[body_end:stop].strip():
        line = first_line + data.count(b"\n", 0, body_end)
        blocks.append(_slow(data[body_end:stop], source, stats, line, final))
    out = concat_blocks(blocks)
    _validate(out, stats)
    return out, stats


def _chunks(data: bytes, n: int) -> Iterable[tuple[int, int]]:
    """Byte ranges of whole lines, ~CHUNK_BYTES each, over ``data[:n]`` (n: after a newline).

    The last range takes up to 1.5 x CHUNK_BYTES rather than leave a small one: a rank file
    of just over a chunk is then decoded in one call, with no second block to stack."""
    start = 0
    while start < n:
        want = n if n - start <= CHUNK_BYTES * 3 // 2 else start + CHUNK_BYTES
        cut = data.find(b"\n", want - 1, n)
        end = n if cut < 0 else cut + 1
        yield start, end
        start = end


def _fast(piece: memoryview) -> Block | None:
    try:
        recs = _DECODER.decode_lines(piece)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if not recs:
        return Block(0, {})
    # One flat iterator into a preallocated buffer: ~2x faster than np.array(list of tuples),
    # which first discovers the shape and the type of every element.
    width = len(_FAST_NAMES)
    flat = itertools.chain.from_iterable(map(msgspec.structs.astuple, recs))
    try:
        mat = np.fromiter(flat, np.float64, count=len(recs) * width).reshape(len(recs), width)
    except OverflowError:  # an integer past float range: the line path rejects it by name
        return None
    ids = mat[:, :2]
    if (ids < 0).any() or (ids >= _INT_LIMIT).any():
        return None  # the line-by-line path skips those records and says which lines
    cols = np.ascontiguousarray(mat.T)  # one row per column: contiguous columns
    return Block(len(recs), dict(zip(_FAST_NAMES, cols, strict=True)))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _slow(piece: bytes, source: str, stats: ReadStats, first_line: int, final: bool
          ) -> Block:
    """Line by line: each record's checks, and values of any column or type."""
    kept: list[dict[str, Any]] = []
    for line, r in parse_jsonl(piece, source, stats, first_line, final):
        step: Any = r.get("step")
        rank: Any = r.get("rank", 0)
        if not _is_int(step) or not _is_int(rank):
            stats.note(f"{source}:{line}: record has no integer 'step'/'rank', skipped",
                       "no integer step/rank")
            continue
        if not (0 <= int(step) < _INT_LIMIT and 0 <= int(rank) < _INT_LIMIT):
            stats.note(f"{source}:{line}: step/rank out of range, skipped",
                       "step/rank out of range")
            continue
        kept.append(r)
    names: dict[str, None] = dict.fromkeys(("step", "rank"))
    for r in kept:
        names.update(dict.fromkeys(r))
    n = len(kept)
    cols: dict[str, AnyArray] = {}
    flags: dict[str, AnyArray] = {}
    for name in names:
        if name in ("step", "rank"):
            cols[name] = np.array([r.get(name, 0) for r in kept], dtype=np.float64)
            continue
        cols[name], flag = _slow_column(name, [r.get(name) for r in kept], stats)
        if flag is not None:
            flags[name] = flag
    return Block(n, cols, flags)


def _slow_column(name: str, vals: list[Any], stats: ReadStats
                 ) -> tuple[AnyArray, AnyArray | None]:
    out = np.full(len(vals), np.nan)
    flag = None
    bad = 0
    for i, v in enumerate(vals):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[i] = v
        elif isinstance(v, str) and v in _NONFINITE:
            out[i] = _NONFINITE[v]
            if v == "NaN":
                if flag is None:
                    flag = np.zeros(len(vals), dtype=bool)
                flag[i] = True
        elif v is not None:
            bad += 1
    if bad:
        stats.rejected += bad
        stats.count(f"{name}: not a number", bad)
    return out, flag


def _bounds(name: str, rule: _Rule) -> tuple[float, float]:
    """The closed interval of finite values that pass ``name``'s rule (NaN aside)."""
    big = float(np.finfo(np.float64).max)
    return (0.0 if rule.nonneg else -big), (big if rule.limit is None else rule.limit)


_BOUNDS = {name: _bounds(name, rule) for name, rule in VALUE_RULES.items()}


def _suspects(block: Block) -> list[str]:
    """The ruled columns that may hold a value to drop: a value outside its column's
    interval of finite values that pass (NaN aside: the column's min and max ignore it), or
    an explicit "NaN" where NaN means "not recorded". One pass over all columns; a column
    not named here has nothing for :func:`_validate`'s checks to find."""
    names = [c for c in VALUE_RULES if c in block.cols]
    if not names or not block.n:
        return []
    mat = np.stack([block.cols[c] for c in names])
    lo = np.fmin.reduce(mat, axis=1)  # NaN only where the whole column is NaN
    hi = np.fmax.reduce(mat, axis=1)
    out = []
    for name, a, b in zip(names, lo.tolist(), hi.tolist(), strict=True):
        low, high = _BOUNDS[name]
        explicit_nan = name in block.flags and name not in NAN_MEANINGFUL
        if explicit_nan or not (a != a or (low <= a and b <= high)):
            out.append(name)
    return out


def _validate(block: Block, stats: ReadStats) -> None:
    """Drop (set to not recorded) values that break their column's rule; count them."""
    for name in _suspects(block):
        rule = VALUE_RULES[name]
        col = block.cols[name]
        flag = block.flags.get(name)
        with np.errstate(invalid="ignore"):
            checks = []
            if name not in NAN_MEANINGFUL:
                explicit = ~np.isfinite(col) & ~np.isnan(col)  # +-inf
                if flag is not None:
                    explicit |= flag
                checks.append(("not finite", explicit))
            if rule.nonneg:
                checks.append(("negative", col < 0))
            if rule.limit is not None:
                checks.append((f"implausible (> {rule.limit:g})",
                               np.isfinite(col) & (col > rule.limit)))
        _drop(block, name, checks, stats)


def _drop(block: Block, name: str, checks: list[tuple[str, AnyArray]], stats: ReadStats
          ) -> None:
    col, flag = block.cols[name], block.flags.get(name)
    for reason, bad in checks:
        k = int(np.count_nonzero(bad))
        if not k:
            continue
        col = np.where(bad, np.nan, col)
        if flag is not None:
            flag = flag & ~bad
        stats.rejected += k
        stats.count(f"{name}: {reason}", k)
    block.cols[name] = col
    if flag is not None:
        if flag.any():
            block.flags[name] = flag
        else:
            del block.flags[name]
