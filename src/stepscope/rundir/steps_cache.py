"""Incremental columnar cache of one rank's step file: numpy segments under RUN/.cache/.

The JSONL file stays the source of truth. The cache holds the decoded, validated columns
of the file's first ``end`` bytes (whole lines only) as ``.npy`` segments and a manifest::

    RUN/.cache/steps/rank-00000.jsonl.json           manifest (format, source identity, stats)
    RUN/.cache/steps/rank-00000.jsonl.d/<id>.npy     float64 matrix (columns x rows)
    RUN/.cache/steps/rank-00000.jsonl.d/<id>.nan.npy explicit-NaN flags, when there are any

Each rank file's segments have a directory of their own, so that removing the segments no
manifest names lists a few entries, not the whole cache: at 1,024 ranks a listing of the
shared directory (2,048 entries) took ~0.9 ms, once per rank file written.

Rules, checked on every read:

* same inode, same size and mtime as recorded: the segments are used as they are;
* grown, and the 64 bytes before ``end`` are unchanged: only the new bytes are decoded and
  appended as one more segment (compacted into one when there are many);
* anything else (truncated, rewritten, another inode, another format, a segment missing or of
  the wrong shape, a manifest that does not parse): rebuilt from the JSONL.

A segment holds the columns with a value in its rows: a known column that is NaN throughout
with no explicit "NaN" is left out (the step table holds such a column as one shared NaN
either way), so the columns a run never records are neither written nor read back.

Only whole lines go into the cache; a torn last line is decoded (and counted) on each read
until the writer completes it. Bytes past the size seen by ``stat`` are not read, so a reader
racing a writer sees a consistent prefix. Every cache write is best effort (temporary file,
then ``os.replace``); a read-only run directory just has no cache.

Reading a run never deletes or writes outside it (the rules of :mod:`.derived`): a link
at ``RUN/.cache``, ``.cache/steps``, a ``rank-00000.jsonl.d``, a manifest or a segment is
never followed (the file is read without the cache; the link is left alone), files are
created ``O_EXCL | O_NOFOLLOW``, and only segment-form names (``<12 hex>[.nan].npy``) are
pruned or read; a manifest naming any other file is not a cache.

Example::

    block, stats = load_rank_file(Path("RUN/steps/rank-00000.jsonl"), Path("RUN/.cache/steps"))
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from .derived import make_real_dirs, open_derived, real_dirs, refuse_links, replace_from_tmp
from .steps_decode import VALUE_RULES, Block, ReadStats, concat_blocks, decode_steps
from .steps_lazy import CachedColumns, Part, open_part

__all__ = ["load_rank_file", "read_rank_file", "uncached_bytes", "load_cached_run", "CACHE_FORMAT"]

# Changes whenever what a cached segment means changes (validation rules, layout).
CACHE_FORMAT = "stepscope-steps-2:" + hashlib.sha1(
    repr(sorted((k, v.nonneg, v.limit) for k, v in VALUE_RULES.items())).encode()
).hexdigest()[:12]
_CHECK_BYTES = 64
# More segments than this are rewritten as one: a dashboard re-reading a live run every few
# seconds for two weeks must not leave 100,000 files behind.
_MAX_SEGMENTS = 16
# The names a segment directory holds (``_write_segment``): the only ones pruned or read.
_SEGMENT_NAME = re.compile(r"[0-9a-f]{12}(\.nan)?\.npy")
# RUN/.cache/steps/<file>.d: the directories a cache write may make, from RUN/.cache down.
_CACHE_DEPTH = 3


@dataclass
class _Manifest:
    ino: int
    size: int
    mtime_ns: int
    end: int  # bytes decoded into the segments (always just after a newline)
    lines: int  # newlines in those bytes
    check: str  # hex of the _CHECK_BYTES bytes before ``end``
    segments: list[dict[str, Any]]
    stats: dict[str, Any]


def _manifest_path(cache_dir: Path, source: Path) -> Path:
    return cache_dir / f"{source.name}.json"


def _read_doc(path: Path) -> Any:
    """The parsed manifest file, or None (absent, unreadable, a link, not JSON)."""
    if not real_dirs(path.parent, _CACHE_DEPTH - 1):
        return None
    try:
        with open_derived(path) as f:
            return orjson.loads(f.read())
    except (OSError, orjson.JSONDecodeError):
        return None


def _read_manifest(path: Path) -> _Manifest | None:
    return _manifest_of(_read_doc(path))


def _manifest_of(d: Any) -> _Manifest | None:
    try:
        if d.get("format") != CACHE_FORMAT:
            return None
        m = _Manifest(**{k: d[k] for k in _Manifest.__dataclass_fields__})
        ReadStats.from_dict(m.stats)
        ints = (m.ino, m.size, m.mtime_ns, m.end, m.lines)
        if not all(type(v) is int for v in ints) or not isinstance(m.check, str) \
                or not isinstance(m.segments, list):
            return None
        if not all(_own_name(s["file"]) and (not s["flags"] or _own_name(s["flags"]))
                   for s in m.segments):
            return None  # a name this cache never writes (``../x``, an absolute path)
        return m
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def _own_name(name: Any) -> bool:
    """Whether ``name`` is of the form ``_write_segment`` gives: ``<file>.d/<segment>``."""
    sub, _, leaf = name.partition("/") if isinstance(name, str) else ("", "", "")
    return sub.endswith(".d") and _SEGMENT_NAME.fullmatch(leaf) is not None


def _load_array(path: Path, mmap: bool) -> Any:
    """A segment file, its directories and itself checked not to be links."""
    refuse_links(path.parent, _CACHE_DEPTH)
    if mmap and stat.S_ISREG(os.lstat(path).st_mode):  # np.load maps paths, not files
        return np.load(path, allow_pickle=False, mmap_mode="r")
    with open_derived(path) as f:
        return np.load(f, allow_pickle=False)


def _pread(fd: int, start: int, length: int) -> bytes:
    first = os.pread(fd, length, start) if length > 0 else b""
    if len(first) == length or not first:
        return first
    out = bytearray(first)
    while len(out) < length:
        got = os.pread(fd, length - len(out), start + len(out))
        if not got:
            break  # the file shrank under us: the caller sees fewer bytes
        out += got
    return bytes(out)


def _load_segments(cache_dir: Path, m: _Manifest) -> Block | None:
    blocks = []
    try:
        for seg in m.segments:
            cols = [str(c) for c in seg["columns"]]
            # Mapped, then each column copied out on its own: the table's columns do not
            # keep one rank's whole matrix alive, and no second copy of it is made.
            mat = _load_array(cache_dir / seg["file"], mmap=True)
            if mat.dtype != np.float64 or mat.shape != (len(cols), int(seg["rows"])):
                return None
            mat = [np.array(row) for row in mat]
            flags = {}
            if seg["flags"]:
                fmat = _load_array(cache_dir / seg["flags"], mmap=False)
                if fmat.dtype != np.bool_ or fmat.shape != (len(cols), int(seg["rows"])):
                    return None
                flags = {c: f for c, f in zip(cols, fmat, strict=True) if f.any()}
            blocks.append(Block(int(seg["rows"]), dict(zip(cols, mat, strict=True)), flags))
    except (OSError, ValueError, KeyError, TypeError, EOFError):
        return None
    return concat_blocks(blocks)


def _save_array(path: Path, arr: np.ndarray[Any, Any]) -> None:
    refuse_links(path.parent, _CACHE_DEPTH)  # checked again: planted after the read
    replace_from_tmp(path, lambda f: np.save(f, arr, allow_pickle=False))


def _segment_columns(block: Block) -> list[str]:
    """The block's columns less those it never recorded (see the module docstring)."""
    return [c for c in block.cols if not block.never_recorded(c)]


def _segment_dir(source: Path) -> str:
    return f"{source.name}.d"


def _write_segment(cache_dir: Path, source: Path, block: Block
                   ) -> tuple[dict[str, Any], bool]:
    """The segment's manifest entry, and whether its directory was made for it (then it
    holds nothing else: there is nothing to prune)."""
    cols = _segment_columns(block)
    seg_id = secrets.token_hex(6)
    sub = _segment_dir(source)
    name = f"{sub}/{seg_id}.npy"
    mat = np.stack([block.cols[c] for c in cols])
    made = False
    try:
        _save_array(cache_dir / name, mat)
    except FileNotFoundError:  # the first segment of this file: its directory is made once
        make_real_dirs(cache_dir / sub, _CACHE_DEPTH)
        made = True
        _save_array(cache_dir / name, mat)
    flags = ""
    if block.flags:
        flags = f"{sub}/{seg_id}.nan.npy"
        zeros = np.zeros(block.n, dtype=bool)
        try:
            _save_array(cache_dir / flags, np.stack([block.flags.get(c, zeros) for c in cols]))
        except OSError:
            (cache_dir / name).unlink(missing_ok=True)
            raise
    return {"file": name, "flags": flags, "rows": block.n, "columns": cols}, made


def _write_manifest(cache_dir: Path, source: Path, m: _Manifest) -> None:
    data = orjson.dumps({"format": CACHE_FORMAT, **m.__dict__})
    refuse_links(cache_dir, _CACHE_DEPTH - 1)
    replace_from_tmp(_manifest_path(cache_dir, source), lambda f: f.write(data))


def _prune(cache_dir: Path, source: Path, m: _Manifest) -> None:
    """Remove this file's segments the manifest no longer names (best effort): segment-form
    names of its own directory (a few entries), opened without following a link."""
    sub = _segment_dir(source)
    keep = {s["file"] for s in m.segments} | {s["flags"] for s in m.segments}
    try:
        refuse_links(cache_dir, _CACHE_DEPTH - 1)
        dfd = os.open(cache_dir / sub, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        for name in os.listdir(dfd):
            if _SEGMENT_NAME.fullmatch(name) and f"{sub}/{name}" not in keep:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=dfd)
    finally:
        os.close(dfd)


def _usable(m: _Manifest | None, st: os.stat_result, fd: int) -> bool:
    if m is None or m.ino != st.st_ino or st.st_size < m.size or m.end > st.st_size:
        return False
    if st.st_size == m.size and st.st_mtime_ns != m.mtime_ns:
        return False  # rewritten in place: an append-only file never does this
    start = max(0, m.end - _CHECK_BYTES)
    return _pread(fd, start, m.end - start).hex() == m.check


def _update(cache_dir: Path, source: Path, old: _Manifest | None, st: os.stat_result,
            body_end: int, data_lines: int, check: str, body: Block, prefix: Block | None,
            stats: ReadStats, legacy: list[str]) -> _Manifest | None:
    """Record ``body`` (the newly decoded whole lines) in the cache, best effort: the
    manifest written, None when nothing could be (``legacy``: format-1 segments to remove
    once it is)."""
    try:
        segs = list(old.segments) if old is not None and prefix is not None else []
        if prefix is not None and len(segs) >= _MAX_SEGMENTS:
            segs, body = [], concat_blocks([prefix, body])
        new, fresh = None, False
        if body.n or not segs:
            new, fresh = _write_segment(cache_dir, source, body)
            segs.append(new)
        m = _Manifest(ino=st.st_ino, size=st.st_size, mtime_ns=st.st_mtime_ns, end=body_end,
                      lines=data_lines, check=check, segments=segs, stats=stats.to_dict())
        try:
            _write_manifest(cache_dir, source, m)
        except OSError:
            for f in (new["file"], new["flags"]) if new is not None else ():
                if f:  # the segment just written is named by no manifest: not left behind
                    (cache_dir / f).unlink(missing_ok=True)  # written just now, by name
            raise
        if not fresh and (old is None or prefix is None or not old.segments
                          or len(segs) == 1):
            _prune(cache_dir, source, m)
        for name in legacy:
            (cache_dir / name).unlink(missing_ok=True)
        return m
    except OSError:
        # Read-only or full disk: this read still has its result, just no cache (and no
        # segment directory left empty by the failed write).
        with contextlib.suppress(OSError):
            (cache_dir / _segment_dir(source)).rmdir()
        return None


def _legacy_segments(source: Path, d: Any) -> list[str]:
    """The segments that a manifest ``d`` (parsed) of the format before per-file directories
    (``stepscope-steps-1``: ``RUN/.cache/steps/rank-00000.jsonl.<id>.npy``) names, to remove
    once a new manifest replaces it. Only names of exactly that form, whatever the manifest
    says; none when it is not such a manifest."""
    try:
        if not str(d.get("format", "")).startswith("stepscope-steps-1:"):
            return []
        names = [str(x) for seg in d["segments"] for x in (seg["file"], seg["flags"]) if x]
    except (KeyError, TypeError, AttributeError):
        return []
    form = re.compile(re.escape(source.name) + r"\.[0-9a-f]{12}(\.nan)?\.npy")
    return [n for n in names if form.fullmatch(n)]


def uncached_bytes(path: Path, cache_dir: Path | None) -> int:
    """Bytes of ``path`` that a read would have to decode (its cache aside): the whole
    file without a plausible cache entry, else what it grew by. A cheap estimate (the
    64-byte check is left to the read); it only decides whether processes pay off."""
    try:
        st = path.stat()
    except OSError:
        return 0
    m = _read_manifest(_manifest_path(cache_dir, path)) if cache_dir is not None else None
    if m is None or m.ino != st.st_ino or m.end > st.st_size or st.st_size < m.size:
        return int(st.st_size)
    return int(st.st_size - m.end)


def _whole(path: Path, cache_dir: Path) -> _Manifest | None:
    """The manifest of ``path`` when its segments hold the whole file as it is now."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        m = _read_manifest(_manifest_path(cache_dir, path))
        if m is None or m.end != st.st_size or m.size != st.st_size or not _usable(m, st, fd):
            return None
        return m
    except OSError:
        return None
    finally:
        os.close(fd)


def load_cached_run(files: list[Path], cache_dir: Path
                    ) -> tuple[CachedColumns, list[ReadStats]] | None:
    """All of ``files`` from their cache segments, when every file is wholly cached (else
    None: the caller reads the usual way), with each file's stats.

    Only the segments' headers are read here, and each segment file is kept open: a
    column is read from all of them when first used (``_steps_lazy``), straight into the
    run's array, so the columns a command never reads cost nothing. Duplicates are not
    merged here: the caller checks the order.
    """
    manifests = []
    for f in files:  # the first file not wholly cached ends it (a cold read: the first)
        m = _whole(f, cache_dir)
        if m is None:
            return None
        manifests.append(m)
    if not manifests:
        return None
    segs = [s for m in manifests for s in m.segments]
    parts: list[Part] = []
    try:
        n = sum(int(s["rows"]) for s in segs)
        names = list(dict.fromkeys(str(c) for s in segs for c in s["columns"]))
        flags: dict[str, np.ndarray[Any, Any]] = {}
        at = 0
        for s in segs:
            rows, seg_cols = int(s["rows"]), [str(c) for c in s["columns"]]
            if not real_dirs((cache_dir / s["file"]).parent, 1):
                raise ValueError(f"{s['file']}: its directory is a link, not followed")
            part = open_part(cache_dir / s["file"], seg_cols, rows, at)
            if part is None:
                raise ValueError(f"segment {s['file']} does not match its manifest")
            parts.append(part)
            if s["flags"]:
                fmat = _load_array(cache_dir / s["flags"], mmap=False)
                if fmat.dtype != np.bool_ or fmat.shape != (len(seg_cols), rows):
                    raise ValueError(f"flags {s['flags']} do not match the segment")
                for c, f in zip(seg_cols, fmat, strict=True):
                    if f.any():
                        flags.setdefault(c, np.zeros(n, dtype=bool))[at:at + rows] = f
            at += rows
    except (OSError, ValueError, KeyError, TypeError, EOFError):
        for p in parts:
            os.close(p.fd)
        return None
    stats = []
    for m in manifests:
        s_ = ReadStats(files=1)
        s_.merge(ReadStats.from_dict(m.stats))
        s_.records = sum(int(s["rows"]) for s in m.segments)
        stats.append(s_)
    return CachedColumns(n, names, parts, flags), stats


def _newlines(data: bytes, end: int) -> int:
    """``data.count(b"\\n", 0, end)``, a third of the time (0.14 ms a megabyte, not 0.42)."""
    return int(np.count_nonzero(np.frombuffer(data, np.uint8, count=end) == 10))


def load_rank_file(path: Path, cache_dir: Path | None) -> tuple[Block, ReadStats]:
    """Validated columns of one rank file (duplicates not yet merged), and what was skipped."""
    block, stats, _ = read_rank_file(path, cache_dir)
    return block, stats


def read_rank_file(path: Path, cache_dir: Path | None) -> tuple[Block, ReadStats, bool]:
    """``load_rank_file``, and whether the cache held all of the file as it was read (its
    segments as they were, or written by this read): then a reader can take it from there."""
    stats = ReadStats(files=1)
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            return _load(fd, path, cache_dir, stats)
        finally:
            os.close(fd)
    except OSError as exc:
        stats = ReadStats(files=1)
        stats.count("unreadable file")  # a file, not a record: ``skipped`` stays as it is
        stats.problem(f"{path.name}: unreadable ({exc}), skipped")
        return Block(0, {}), stats, False


def _load(fd: int, path: Path, cache_dir: Path | None, stats: ReadStats
          ) -> tuple[Block, ReadStats, bool]:
    st = os.fstat(fd)
    doc = _read_doc(_manifest_path(cache_dir, path)) if cache_dir is not None else None
    m = _manifest_of(doc) if doc is not None else None
    prefix = None
    if cache_dir is not None and m is not None and _usable(m, st, fd):
        prefix = _load_segments(cache_dir, m)
    if m is None or prefix is None:
        m, start, lines, cached = None, 0, 0, ReadStats()
    else:
        start, lines, cached = m.end, m.lines, ReadStats.from_dict(m.stats)
    data = _pread(fd, start, st.st_size - start)
    body_end = data.rfind(b"\n") + 1
    body, body_stats = decode_steps(data, path.name, lines + 1, final=False, end=body_end)
    # Line numbers matter only for a cache manifest and a torn tail's message.
    body_lines = (_newlines(data, body_end)
                  if cache_dir is not None or body_end < len(data) else 0)
    tail, tail_stats = decode_steps(data[body_end:], path.name, lines + 1 + body_lines,
                                    final=True)
    cached.merge(body_stats)
    held = m if cache_dir is not None else None  # the manifest in effect after this read
    if cache_dir is not None and (m is None or body_end or st.st_size != m.size):
        end = start + body_end
        check = _pread(fd, max(0, end - _CHECK_BYTES), min(end, _CHECK_BYTES))
        legacy = _legacy_segments(path, doc) if m is None and doc is not None else []
        held = _update(cache_dir, path, m, st, end, lines + body_lines,
                       check.hex(), body, prefix, cached, legacy)
    stats.merge(cached)
    stats.merge(tail_stats)
    whole = held is not None and held.end == held.size == st.st_size
    return concat_blocks([b for b in (prefix, body, tail) if b is not None]), stats, whole
