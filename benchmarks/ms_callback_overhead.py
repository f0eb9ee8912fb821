"""MindSpore callback overhead, measured against a bare ``Model.train`` in the same run.

Three arms train the same compiled model (GRAPH_MODE, CPU, the quick-start MLP on
synthetic MNIST-shaped batches), interleaved round by round so machine noise hits all
alike:

* ``bare``: ``Model.train`` with no callback;
* ``loss``: a callback that reads the loss each step (what LossMonitor does: the one host
  sync the issue allows stepscope);
* ``stepscope``: :class:`StepscopeCallback`.

Prints the median per-step time of each arm, the ratio stepscope / bare, and the time spent
inside the StepscopeCallback's step hooks per step (its own cost, timed around each hook).
Target (issue 17): under 50 µs per step beyond the loss read.

Run: ``.venv/bin/python benchmarks/ms_callback_overhead.py [--rounds 6 --steps 200]``
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import dataset as ds
from mindspore import nn
from mindspore.train import Callback, Model

from stepscope.integrations.mindspore import StepscopeCallback


class LossRead(Callback):  # type: ignore[misc]
    def on_train_step_end(self, run_context: Any) -> None:
        run_context.original_args().net_outputs.asnumpy()


class Timed(StepscopeCallback):
    """The callback with its step hooks timed: CPU seconds of the training thread inside
    them (``thread_time``: on a shared host, wall time inside a hook also holds the time
    other processes ran), summed."""

    inside = 0.0

    def on_train_step_begin(self, run_context: Any) -> None:
        t0 = time.thread_time()
        super().on_train_step_begin(run_context)
        Timed.inside += time.thread_time() - t0

    def on_train_step_end(self, run_context: Any) -> None:
        # Wait for the step first (the loss read's sync, which a bare loop pays too), so
        # the timer holds stepscope's own work only, not the device finishing the step.
        run_context.original_args().net_outputs.asnumpy()
        t0 = time.thread_time()
        super().on_train_step_end(run_context)
        Timed.inside += time.thread_time() - t0


def _data(steps: int, batch: int) -> ds.Dataset:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((steps * batch, 784)).astype(np.float32)
    y = rng.integers(0, 10, steps * batch).astype(np.int32)
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(batch)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(784, 512), nn.ReLU(), nn.Dense(512, 512), nn.ReLU(),
                            nn.Dense(512, 10))
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  nn.Momentum(net.trainable_params(), 1e-3, 0.9))
    data = _data(a.steps, a.batch)
    model.train(1, data, dataset_sink_mode=False)  # compile once, outside the rounds
    tmp = Path(tempfile.mkdtemp(prefix="ms-overhead-"))
    per_step: dict[str, list[float]] = {"bare": [], "loss": [], "stepscope": []}
    inside: list[float] = []
    for r in range(a.rounds):
        order = list(per_step) if r % 2 == 0 else list(reversed(per_step))
        for arm in order:
            cbs: list[Any] = []
            if arm == "loss":
                cbs = [LossRead()]
            elif arm == "stepscope":
                Timed.inside = 0.0
                cbs = [Timed(tmp / f"run-{r}")]
            t0 = time.perf_counter()
            model.train(1, data, callbacks=cbs, dataset_sink_mode=False)
            per_step[arm].append((time.perf_counter() - t0) / a.steps)
            if arm == "stepscope":
                inside.append(Timed.inside / a.steps)
    med = {k: statistics.median(v) for k, v in per_step.items()}
    for k, v in med.items():
        print(f"{k:10s} {v * 1e3:8.3f} ms/step")
    print(f"ratio stepscope/bare: {med['stepscope'] / med['bare']:.3f} "
          f"(stepscope - loss read: {(med['stepscope'] - med['loss']) * 1e6:+.0f} µs/step)")
    print(f"inside the callback's step hooks: {statistics.median(inside) * 1e6:.1f} µs/step "
          f"(after the step finished; target < 50 µs)")


if __name__ == "__main__":
    main()
