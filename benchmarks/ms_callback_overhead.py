"""MindSpore callback overhead, measured against a bare ``Model.train`` in the same run.

Four arms train the same compiled model (GRAPH_MODE, CPU, the quick-start MLP on
synthetic MNIST-shaped batches), their order shuffled each round so machine noise hits all
alike (the style of ``benchmarks/overhead.py``):

* ``bare``: ``Model.train`` with no callback;
* ``control``: the same again (the A/A control: its ratio to ``bare`` is this host's noise
  floor, measured in the same run);
* ``loss``: a callback that reads the loss each step (what LossMonitor does: the one host
  sync the budget allows stepscope);
* ``stepscope``: :class:`StepscopeCallback` (one, kept open across the rounds, as
  ``stepscope run`` keeps its injected one: its start-up is not a per-step cost).

Per arm and round it takes the wall time and the CPU time of the whole process
(``process_time``: every thread, MindSpore's workers and stepscope's writer and memory
sampler included) per step. It prints the median of each, the ratios against ``bare`` with
a 95% bootstrap interval, and the per-step difference stepscope - loss in CPU µs (the
target: under 50 µs beyond the loss read), and the CPU time of the training thread inside
the callback's step hooks (``thread_time`` around each hook, after the step finished).

Run: ``.venv/bin/python benchmarks/ms_callback_overhead.py [--rounds 16 --steps 200]``
"""

from __future__ import annotations

import argparse
import random
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


def _ci(values: list[float], seed: int) -> tuple[float, float, float]:
    """Median and its 95% bootstrap interval."""
    rng = random.Random(seed)
    boot = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(2000))
    return statistics.median(values), boot[50], boot[1949]


def _ratio(num: list[float], den: list[float]) -> str:
    med, lo, hi = _ci([x / y for x, y in zip(num, den, strict=True)], seed=1)
    return f"{med:.4f}  95% CI [{lo:.4f}, {hi:.4f}]"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=16)
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
    cb = Timed(Path(tempfile.mkdtemp(prefix="ms-overhead-")) / "run", keep_open=True)
    for cbs in ([], [cb]):  # compile, and open the callback's run, outside the rounds
        model.train(1, data, callbacks=cbs, dataset_sink_mode=False)
    arms: dict[str, list[Any]] = {"bare": [], "control": [], "loss": [LossRead()],
                                  "stepscope": [cb]}
    wall: dict[str, list[float]] = {k: [] for k in arms}
    cpu: dict[str, list[float]] = {k: [] for k in arms}
    inside: list[float] = []
    rng = random.Random(0)
    for _ in range(a.rounds):
        order = list(arms)
        rng.shuffle(order)
        for arm in order:
            Timed.inside = 0.0
            c0, t0 = time.process_time(), time.perf_counter()
            model.train(1, data, callbacks=arms[arm], dataset_sink_mode=False)
            wall[arm].append((time.perf_counter() - t0) / a.steps)
            cpu[arm].append((time.process_time() - c0) / a.steps)
            if arm == "stepscope":
                inside.append(Timed.inside / a.steps)
    cb.close()
    print(f"Model.train, GRAPH_MODE CPU MLP, {a.rounds} rounds x {a.steps} steps, "
          "arm order shuffled per round:")
    for k in arms:
        print(f"  {k:10s} wall {statistics.median(wall[k]) * 1e3:8.3f} ms/step   "
              f"process CPU {statistics.median(cpu[k]) * 1e3:8.3f} ms/step")
    for what, t in (("wall", wall), ("process CPU", cpu)):
        print(f"  {what} ratio stepscope/bare: {_ratio(t['stepscope'], t['bare'])}")
        print(f"  {what} ratio control/bare:   {_ratio(t['control'], t['bare'])}  (A/A)")
        print(f"  {what} ratio loss/bare:      {_ratio(t['loss'], t['bare'])}")
    diff = [(s - lo) * 1e6 for s, lo in zip(cpu["stepscope"], cpu["loss"], strict=True)]
    med, lo, hi = _ci(diff, seed=2)
    print(f"  process CPU stepscope - loss read: {med:+.1f} µs/step  95% CI [{lo:+.1f}, "
          f"{hi:+.1f}] (target < 50)")
    med, lo, hi = _ci([v * 1e6 for v in inside], seed=3)
    print(f"  training thread inside the callback's step hooks: {med:.1f} µs/step  "
          f"95% CI [{lo:.1f}, {hi:.1f}] (after the step finished; target < 50)")


if __name__ == "__main__":
    main()
