"""Demo data: real text every machine has, tokenized by a byte-level tokenizer we ship.

The corpus is the Python standard library's own ``.py`` sources (deterministic order),
encoded as UTF-8 bytes; each byte is a token (``VOCAB_SIZE = 256``). Nothing is
downloaded. Framework-free: batches are numpy arrays, adapters convert them.

Example::

    tokens = load_corpus(max_bytes=1 << 20)
    for x, y in batch_iter(tokens, batch_size=8, seq_len=256, seed=0):
        ...   # x, y: int64 arrays of shape (8, 256); y is x shifted by one token
"""

from __future__ import annotations

import sysconfig
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt

__all__ = ["VOCAB_SIZE", "load_corpus", "batch_iter", "slow_batch_iter", "ByteTokenizer"]

VOCAB_SIZE = 256
TokenArray = npt.NDArray[np.int64]


class ByteTokenizer:
    """UTF-8 bytes as tokens: lossless, no vocabulary file, vocab size 256."""

    vocab_size = VOCAB_SIZE

    def encode(self, text: str) -> TokenArray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def decode(self, tokens: npt.ArrayLike) -> str:
        return bytes(np.asarray(tokens, dtype=np.uint8).tolist()).decode("utf-8", "replace")


def _stdlib_sources() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.is_file())
    if not files:  # pragma: no cover - a Python without its sources
        raise RuntimeError(f"no Python sources under {root}; the demo corpus needs them")
    return files


def load_corpus(max_bytes: int = 4 << 20) -> npt.NDArray[np.uint8]:
    """The first ``max_bytes`` bytes of the stdlib sources, as uint8 tokens."""
    chunks: list[bytes] = []
    total = 0
    for f in _stdlib_sources():
        data = f.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return np.frombuffer(b"".join(chunks)[:max_bytes], dtype=np.uint8)


def batch_iter(tokens: npt.NDArray[np.uint8], batch_size: int, seq_len: int,
               seed: int = 0) -> Iterator[tuple[TokenArray, TokenArray]]:
    """Endless random windows of ``seq_len + 1`` tokens: (inputs, next-token targets)."""
    rng = np.random.default_rng(seed)
    hi = len(tokens) - seq_len - 1
    offsets = np.arange(seq_len + 1)
    while True:
        starts = rng.integers(0, hi, size=batch_size)
        win = tokens[starts[:, None] + offsets].astype(np.int64)
        yield win[:, :-1], win[:, 1:]


def slow_batch_iter(text_files: list[Path] | None, batch_size: int, seq_len: int,
                    seed: int = 0, doc_bytes: int = 192 << 10
                    ) -> Iterator[tuple[TokenArray, TokenArray]]:
    """A deliberately slow pipeline, like the field report's: every sample re-reads a
    document and tokenizes it serially in the main process in pure Python, then takes a
    window. Real work, not a sleep, so it competes with training for the CPU as it would.
    """
    files = text_files or _stdlib_sources()
    rng = np.random.default_rng(seed)
    while True:
        rows = []
        for _ in range(batch_size):
            data = b""
            while len(data) < doc_bytes:  # small files: keep appending documents
                data += files[int(rng.integers(len(files)))].read_bytes()
            text = data[:doc_bytes].decode("utf-8", "replace")
            ids = [b for ch in text for b in ch.encode("utf-8")]  # serial "tokenizer"
            start = int(rng.integers(0, len(ids) - seq_len - 1))
            rows.append(ids[start:start + seq_len + 1])
        win = np.asarray(rows, dtype=np.int64)
        yield win[:, :-1], win[:, 1:]
