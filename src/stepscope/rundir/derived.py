"""Where a reader of a run directory may write: its derived state, never through a link.

A run directory can come from anyone (a tarball, a group-writable shared runs folder), so
reading it must be safe whatever it holds. The readers (``report``, ``index``, ``diagnose``,
``compare``, the dashboard) keep derived data under ``RUN/.cache/`` (the step cache, the
stored summaries) and follow three rules there:

* a symbolic link (or anything but a directory) where a derived directory belongs
  (``RUN/.cache``, ``RUN/.cache/steps``, ``RUN/.cache/steps/rank-00000.jsonl.d``,
  ``RUN/.cache/summary``) is never followed: the reader goes on without that cache (it
  reads the JSONL as if there were none) and leaves the link as it is;
* a file a reader creates is opened with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (a planted link
  of that name fails the open, never redirects the write), then moved into place with
  ``os.replace`` (which replaces a link, never writes through it); a derived file read back
  is opened with ``O_NOFOLLOW``;
* a reader unlinks only names of the forms it writes itself (segment and temporary names),
  listed from a directory it opened with ``O_NOFOLLOW``, never a name a manifest supplies.

Example::

    cache = derived_dir(run.path, ".cache", "steps")   # None: a link is there; no cache
    if cache is not None:
        make_real_dirs(cache, 2)                       # RUN/.cache, then RUN/.cache/steps
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

__all__ = ["derived_dir", "make_real_dirs", "real_dirs", "refuse_links", "LinkRefused",
           "open_derived", "replace_from_tmp"]

# os.O_NOFOLLOW is POSIX; the package runs on Linux and macOS only (see pyproject).
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class LinkRefused(OSError):
    """A derived-state path is a symbolic link or not a directory: not followed."""


def _is_real_dir(path: Path) -> bool | None:
    """True: a directory (not a link to one); False: something else; None: absent."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return None


def real_dirs(path: Path, depth: int) -> bool:
    """Whether none of the last ``depth`` components of ``path`` that exist is a link or
    a non-directory (absent ones are fine: a writer makes them with ``make_real_dirs``)."""
    p = path
    for _ in range(depth):
        try:
            if _is_real_dir(p) is False:
                return False
        except OSError:
            return False
        p = p.parent
    return True


def refuse_links(path: Path, depth: int) -> None:
    """:class:`LinkRefused` unless ``real_dirs(path, depth)``."""
    if not real_dirs(path, depth):
        raise LinkRefused(f"{path} or a folder above it is a symbolic link: not followed")


def derived_dir(run_path: Path, *parts: str) -> Path | None:
    """``run_path / parts...`` when no existing component of it below the run directory is
    a symbolic link or a non-directory, else None (a reader then keeps no cache there)."""
    path = Path(run_path).joinpath(*parts)
    return path if real_dirs(path, len(parts)) else None


def make_real_dirs(path: Path, depth: int) -> None:
    """``os.makedirs`` of the last ``depth`` components of ``path`` (the ones above must
    exist) that never follows a link: each is made, or found, as a real directory, else
    :class:`LinkRefused` (an ``OSError``: the caller's best-effort handling covers it)."""
    chain = [path]
    for _ in range(depth - 1):
        chain.append(chain[-1].parent)
    for p in reversed(chain):
        try:
            os.mkdir(p, 0o755)
        except FileExistsError:
            pass
        if not _is_real_dir(p):
            raise LinkRefused(f"{p} is a symbolic link or not a directory: not followed")


def open_derived(path: Path) -> IO[bytes]:
    """``path`` opened for reading without following a link at its last component."""
    return os.fdopen(os.open(path, os.O_RDONLY | _NOFOLLOW), "rb")


def replace_from_tmp(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """``write(f)`` into a new temporary file beside ``path`` (created exclusively, never
    through a link), then moved into place; on any failure the temporary file is removed.
    The temporary name ends ``.<pid>.tmp``, the form stale-file sweeps look for."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
