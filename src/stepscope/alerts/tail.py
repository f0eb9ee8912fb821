"""Following a JSONL file by offset: the records appended since the last look.

An unfinished last line (a writer mid-append) is held until its newline arrives; a corrupt
line is skipped, as the readers skip it. ``stepscope watch`` follows step, condition and
event files with it, and the in-process monitor its own rank's condition samples.

Example::

    tail = JsonlTail(run.conditions_path(0))
    for sample in tail.read():      # only what was appended since the previous read
        ...
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

__all__ = ["JsonlTail"]

# Read at most this much of a file per look, so a huge backlog is caught up in steps.
_CHUNK_BYTES = 8 << 20


@dataclass
class JsonlTail:
    """Reads the records appended to one JSONL file since the last ``read``."""

    path: Path
    offset: int = 0
    partial: bytes = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(_CHUNK_BYTES)
        except OSError:
            return []
        self.offset += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()  # an unfinished last line waits for its newline
        out = []
        for line in lines:
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # a corrupt record: the readers skip it too
            if isinstance(rec, dict):
                out.append(rec)
        return out
