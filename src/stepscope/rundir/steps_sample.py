"""A quick, explicitly partial step table: evenly spaced byte windows of each rank file.

Decoding a long run's JSONL whole takes seconds (~5 s a GB); a dashboard that has nothing
cached yet draws its first paint from a sample instead while the full read runs. Each rank
file is read in ``windows`` evenly spaced windows (the first at the file's start, the last
at its end) of ``budget / files / windows`` bytes; the whole lines inside each window are
decoded by the usual decoder, so the sample's records are the run's own records (validated
the same way), spread across the whole step range. What lies between the windows is not
read: a spike there is not in the sample (the full read keeps every one).

Example::

    sample = sample_step_files(sorted(Path("RUN/steps").glob("rank-*.jsonl")), 8 << 20)
    sample.table, sample.records, sample.estimated_records
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..schema import StepTable
from .steps_decode import ReadStats, concat_blocks, decode_steps
from .steps_table import DUPLICATE_ACROSS, block_to_table, merge_duplicates

__all__ = ["Sample", "sample_step_files", "WINDOWS"]

WINDOWS = 512  # windows per rank file: points across the step range of every chart
_MIN_WINDOW = 4096  # bytes: a window holds some whole lines of ~300-byte records


@dataclass
class Sample:
    """The sampled table, its records, and the records the files hold by the sample's
    mean bytes per record (an estimate: the files are not read whole)."""

    table: StepTable
    records: int
    estimated_records: int
    bytes_read: int
    bytes_total: int


def _windows(fd: int, size: int, width: int, count: int) -> tuple[bytes, int]:
    """The whole lines of ``count`` evenly spaced windows of ``width`` bytes, joined, and
    the bytes read. A window starting mid-line drops that line's head; one ending mid-line
    drops its tail (the next window or nothing has it: lines are never split)."""
    if size <= width * count:
        data = os.pread(fd, size, 0)
        return data[:data.rfind(b"\n") + 1], len(data)
    pieces, read = [], 0
    span = size - width
    for i in range(count):
        at = span * i // (count - 1) if count > 1 else 0
        data = os.pread(fd, width, at)
        read += len(data)
        head = 0 if at == 0 else data.find(b"\n") + 1
        tail = data.rfind(b"\n") + 1
        if head < tail and (at == 0 or head > 0):
            pieces.append(data[head:tail])
    return b"".join(pieces), read


def sample_step_files(files: Sequence[Path], budget: int, windows: int = WINDOWS
                      ) -> Sample:
    """About ``budget`` bytes of ``files`` in ``windows`` windows each (see the module)."""
    blocks, estimated, read, total = [], 0, 0, 0
    per_file = budget // max(1, len(files))
    count = max(2, min(windows, per_file // _MIN_WINDOW))
    width = max(_MIN_WINDOW, per_file // count)
    for path in files:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            size = os.fstat(fd).st_size
            data, got = _windows(fd, size, width, count)
        finally:
            os.close(fd)
        block, stats = decode_steps(data, path.name, final=False)
        block = merge_duplicates(block, path.name, stats)
        read, total = read + got, total + size
        if block.n and data:
            estimated += round(block.n * size / len(data))
        blocks.append(block)
    block = concat_blocks(blocks, consume=True)
    if len(blocks) > 1 and block.n:
        block = merge_duplicates(block, "steps/", ReadStats(), DUPLICATE_ACROSS,
                                 merge_late=False)
    return Sample(block_to_table(block), block.n, max(estimated, block.n), read, total)
