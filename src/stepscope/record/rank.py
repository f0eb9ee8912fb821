"""Which rank this process is: one resolver for every adapter. Framework-free.

The framework's own answer wins once its process group exists (``torch.distributed``,
``mindspore.communication``): processes started by ``torch.multiprocessing.spawn`` or a
training child process have no ``RANK`` variable, and all of them used to resolve to 0.
The launcher's environment is the fallback, then 0. Step files are claimed per process as
well (:meth:`stepscope.rundir.store.RunDir.claim_steps_path`), so two processes that still resolve
the same rank never write one file.

Example::

    rank = resolve_rank(lambda: dist.get_rank() if dist.is_initialized() else None)
"""

from __future__ import annotations

import os
from collections.abc import Callable

__all__ = ["ENV_RANK_VARS", "env_rank", "resolve_rank"]

# torchrun/torch.distributed (RANK), MindSpore msrun (RANK_ID), Open MPI, SLURM tasks:
# the first one set and numeric wins.
ENV_RANK_VARS: tuple[str, ...] = ("RANK", "RANK_ID", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")


def env_rank() -> int | None:
    """The global rank the launcher put in the environment, or None."""
    for var in ENV_RANK_VARS:
        value = os.environ.get(var, "").strip()
        if value.isdigit():
            return int(value)
    return None


def resolve_rank(framework: Callable[[], int | None] | None = None) -> int:
    """``framework()`` (the group's rank, None before the group exists), else env, else 0.

    A probe that raises counts as "no group": resolving a rank never stops training.
    """
    if framework is not None:
        try:
            rank = framework()
        except Exception:
            rank = None
        if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0:
            return rank
    found = env_rank()
    return 0 if found is None else found
