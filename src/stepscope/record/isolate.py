"""Isolation experiments from your own training loop (the Python equivalents of
``stepscope isolate data|comm``).

Run the loop twice with a ``Recorder`` each, once as is and once with one suspect removed,
then let :func:`stepscope.analysis.isolation.data_isolation_verdict` (or the comm one)
compare them, and :func:`record_isolation` store the verdict where ``stepscope diagnose``
and ``stepscope report`` show it.

* data: iterate :class:`ReplayBatches` instead of the loader: the first ``batches`` real
  batches, held in memory, replayed in a cycle (same shapes, no loading/tokenizing cost).
  Framework-free: it takes any iterable of batches, a ``torch.utils.data.DataLoader`` or a
  MindSpore dataset's ``create_tuple_iterator()``; for MindSpore ``Model.train`` wrap it in
  ``mindspore.dataset.GeneratorDataset(ReplayBatches(...), column_names=[...])``.
* comm (PyTorch DDP): ``ddp_model.register_comm_hook(None, noop_grad_sync_hook)``: every
  rank keeps its local gradients. The upper bound of what overlap/compression can win;
  **not a valid training run**.

Example::

    from stepscope import Recorder
    from stepscope.record.isolate import ReplayBatches, record_isolation
    from stepscope.analysis.isolation import data_isolation_verdict

    train(Recorder("runs/base"), loader)                            # your loop, as is
    train(Recorder("runs/replay"), ReplayBatches(loader, steps=50))  # data cost removed
    base, _ = RunDir.open("runs/base").read_steps()
    replay, _ = RunDir.open("runs/replay").read_steps()
    record_isolation("runs/base", data_isolation_verdict(base, replay), "runs/replay")
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..errors import ConfigError
from ..rundir.store import ISOLATION_EVENT, RunDir

if TYPE_CHECKING:  # the verdict is the caller's (analysis.isolation): stored, not judged
    from ..analysis.isolation import IsolationResult

__all__ = ["ReplayBatches", "noop_grad_sync_hook", "record_isolation"]

T = TypeVar("T")


class ReplayBatches(Generic[T]):
    """Replays the first ``batches`` batches of ``loader`` from memory.

    ``steps``: batches yielded per iteration (default: the loader's length when it has one,
    else ``batches``), so an epoch loop runs as long as with the real loader.
    """

    def __init__(self, loader: Iterable[T], batches: int = 8, steps: int | None = None) -> None:
        if batches < 1:
            raise ConfigError(f"ReplayBatches needs batches >= 1, got {batches}")
        self.cached: list[T] = list(itertools.islice(iter(loader), batches))
        if not self.cached:
            raise ConfigError("ReplayBatches: the loader yielded no batch to replay")
        try:
            default = len(loader)  # type: ignore[arg-type]
        except TypeError:
            default = len(self.cached)
        self.steps = int(steps) if steps is not None else int(default)

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[T]:
        return itertools.islice(itertools.cycle(self.cached), self.steps)


# No annotations on purpose: DDP's _check_comm_hook rejects any ``bucket``/return
# annotation other than the real GradBucket/Future types, and with
# ``from __future__ import annotations`` ours would be strings.
def noop_grad_sync_hook(state, bucket):  # type: ignore[no-untyped-def]
    """DDP comm hook that skips the all-reduce: each rank keeps its local gradients.

    ``ddp_model.register_comm_hook(None, noop_grad_sync_hook)`` -- the run is then an
    upper bound on speed and not a valid training run (ranks drift apart).
    """
    import torch  # lazily: the rest of this module is framework-free

    fut: Any = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def record_isolation(run_dir: str | os.PathLike[str], result: IsolationResult,
                     experiment_run: str | os.PathLike[str] | None = None,
                     **extra: Any) -> dict[str, Any]:
    """Append the verdict to ``run_dir``'s events.jsonl (where diagnose/report read it);
    ``extra``: more keys of the record (``isolate``: the steps it measured). Returns the
    record, the one form every writer of a verdict uses."""
    event = {"type": ISOLATION_EVENT, "kind": result.kind, "result": result.to_dict(),
             "baseline_run": str(run_dir),
             "experiment_run": str(experiment_run) if experiment_run is not None else None,
             **extra}
    RunDir.open(run_dir).append_event(event)
    return event
