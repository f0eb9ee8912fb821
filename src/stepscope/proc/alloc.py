"""glibc's allocator set for bulk column work in processes that stepscope owns.

A 10-million-row table's columns and the temporaries the analyses make of them are 1-80 MB
each. glibc serves every allocation over its mmap threshold (128 KiB, rising only as far as
the largest block freed so far) with a fresh ``mmap``, and hands it back with ``munmap``
when freed. The next array of that size then faults in every one of its pages again. On
the 2-core VM this was measured on, a cold read of 1,024 rank files spent 4.1-5.5 s of
system CPU, most of it in those page faults.

:func:`tune_for_bulk` lets every block come from the heap, where a freed block is reused
without new faults: none is mapped on its own (``M_MMAP_MAX`` 0; the threshold, 32 MiB, is
the highest glibc takes, and a 9.6-million-row column is 77 MB). It keeps up to 256 MiB of
freed memory at the top of the heap instead of trimming it on each free, and grows the heap
64 MiB at a time. (glibc still maps memory when the heap cannot grow: nothing fails.)

Measured on three paired cold reads (1,024 ranks x 2,000 steps, 1.1 GB of JSONL): system
CPU went from 4.1-5.5 s to 2.7-3.7 s, and wall time from 6.2-7.6 s to 5.4-6.0 s. With no
block mapped on its own, the analysis of a 9.6-million-row run (64 ranks x 150,000 steps,
summarize and diagnose, read from its cache) went from 14.1-19.4 s with 6.4-11.3 s of
system time and 3.3 million page faults to 9.4-11.8 s, 1.6-3.9 s and 417,000 (four
runs); its peak 1,480 -> 1,507 MB.

It is called only where stepscope owns the whole process:

* in the step reader's worker processes (:mod:`stepscope.rundir.steps_table`), which exit when
  the read is done;
* by the CLI, for its one-shot analysis commands (:data:`stepscope.cli.BULK_COMMANDS`).

It is never called on ``import stepscope``. A training process that records its steps
keeps its allocator exactly as it was. The dashboard server (``serve``) and ``watch`` also
keep theirs: they run for days, and a heap that keeps its peak would stay at that peak for
all that time.

It also stops numpy from asking for transparent huge pages (``madvise(MADV_HUGEPAGE)``,
numpy's default for arrays of 4 MB and more on Linux). Where the kernel compacts memory
for such a request on the fault (``defrag`` set to ``madvise``, the common default), a
fresh 16 MB column costs far more system time than in 4 KB pages. Measured on this VM:
summarize of a 1,024-rank run (2 million rows) read from its cache, 1.39-1.70 s with
0.86-1.15 s of system time, and 0.81-0.97 s with 0.22-0.34 s once numpy no longer
asks; a cold ``report --json`` 5.17-5.62 s and 5.01-5.18 s, three runs each, alternated.

Each setting is best effort. On another C library (musl, macOS), or where ``mallopt``
rejects a value, nothing changes and nothing fails.

Example::

    tune_for_bulk()   # True when glibc took every setting
"""

from __future__ import annotations

import sys
from collections.abc import Callable

__all__ = ["tune_for_bulk", "SETTINGS"]

# mallopt parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
# 32 MiB is the largest mmap threshold glibc accepts on 64-bit (HEAP_MAX_SIZE / 2): a
# 4-million-row float64 column. Larger blocks would still be mapped one by one: mmap_max
# 0 turns that off.
SETTINGS: dict[str, tuple[int, int]] = {
    "mmap_threshold": (_M_MMAP_THRESHOLD, 32 << 20),
    "trim_threshold": (_M_TRIM_THRESHOLD, 256 << 20),
    "top_pad": (_M_TOP_PAD, 64 << 20),
    "mmap_max": (_M_MMAP_MAX, 0),  # blocks over the threshold: from the heap too
}
_done: bool | None = None


def _mallopt() -> Callable[[int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # here: the CLI imports this module on every start

    try:
        # The process's own symbols (dlopen(NULL)): libc is loaded already, and this does
        # not run ldconfig as ctypes.util.find_library would.
        fn = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    out: Callable[[int, int], int] = fn
    return out


def _numpy_hugepages_off() -> None:
    """numpy no longer madvises its large arrays for huge pages (best effort: the switch
    is private, ``numpy._core`` from numpy 2 on, ``numpy.core`` before)."""
    import importlib

    for name in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            switch = importlib.import_module(name)._set_madvise_hugepage
        except (ImportError, AttributeError):
            continue
        switch(False)
        return


def tune_for_bulk() -> bool:
    """Apply :data:`SETTINGS` to this process's allocator and turn numpy's huge-page
    requests off, once; True when glibc took each setting (see the module docstring for
    where this may be called)."""
    global _done
    if _done is None:
        _numpy_hugepages_off()
        fn = _mallopt()
        _done = fn is not None and all(fn(param, value) == 1
                                       for param, value in SETTINGS.values())
    return _done
