"""The MindSpore quick-start PyNative loop (``forward_fn`` / ``value_and_grad`` /
``train_step``) on a small CNN, measured by LoopRecorder with a profile of some steps.

usage: ms_pynative_loop.py RUN_DIR [--steps N] [--profile A:B] [--direct K] [--graph]

--graph: the same loop in GRAPH mode with ``train_step`` under ``mindspore.jit`` (the
tutorial's compiled variant), for comparing profiles of the two modes.
--model-train: the same network trained by ``Model.train`` (PyNative) with
StepscopeCallback instead of the loop (no direct measurement then).

After training, the script measures its phases directly (the fastest of K interleaved runs,
every call followed by a sync): the forward alone (``forward_fn``), forward+backward
(``grad_fn``) and the update alone (``optimizer(grads)``). Prints one JSON line:
{"direct_ms": {...}, "losses": [...]}.
"""

from __future__ import annotations

import argparse
import json
import time

import mindspore as ms
import numpy as np
from mindspore import nn

from stepscope.integrations.mindspore import LoopRecorder

BATCH, CH, HW, CLASSES = 8, 3, 16, 10


class SmallCNN(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(CH, 16, 3, pad_mode="same")
        self.conv2 = nn.Conv2d(16, 32, 3, pad_mode="same")
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.dense = nn.Dense(32 * HW * HW, CLASSES)

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return self.dense(self.flatten(self.relu(self.conv2(self.relu(self.conv1(x))))))


def _direct(fns: dict[str, object], k: int) -> dict[str, float]:
    """Fastest of ``k`` interleaved runs of each call, each followed by a sync (ms): the
    minimum is the run least disturbed by other processes on a shared host."""
    from mindspore.graph.api import _pynative_executor

    best = dict.fromkeys(fns, float("inf"))
    for _ in range(k):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()  # type: ignore[operator]
            _pynative_executor.sync()
            best[name] = min(best[name], (time.perf_counter() - t0) * 1e3)
    return best


def _model_train(run_dir: str, model: nn.Cell, loss_fn: nn.Cell, optimizer: nn.Cell,
                 data: list[tuple[ms.Tensor, ms.Tensor]], steps: tuple[int, int]) -> None:
    import mindspore.dataset as ds
    from mindspore.train import Model

    from stepscope.integrations.mindspore.callback import StepscopeCallback

    arrays = [(x.asnumpy(), y.asnumpy()) for x, y in data]
    dataset = ds.GeneratorDataset(arrays, ["data", "label"], shuffle=False)
    cb = StepscopeCallback(run_dir, profile_steps=steps)
    Model(model, loss_fn, optimizer).train(1, dataset, callbacks=[cb],
                                           dataset_sink_mode=False)
    print(json.dumps({"model_train": True}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--profile", default="2:4")
    ap.add_argument("--direct", type=int, default=5)
    ap.add_argument("--graph", action="store_true")
    ap.add_argument("--model-train", action="store_true")
    a = ap.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if a.graph else ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    ms.set_seed(0)
    model = SmallCNN()
    loss_fn = nn.CrossEntropyLoss()
    optimizer = nn.SGD(model.trainable_params(), learning_rate=1e-2, momentum=0.9)

    def forward_fn(data: ms.Tensor, label: ms.Tensor) -> tuple[ms.Tensor, ms.Tensor]:
        logits = model(data)
        return loss_fn(logits, label), logits

    grad_fn = ms.value_and_grad(forward_fn, None, optimizer.parameters, has_aux=True)

    def train_step(data: ms.Tensor, label: ms.Tensor) -> ms.Tensor:
        (loss, _), grads = grad_fn(data, label)
        optimizer(grads)
        return loss

    if a.graph:
        train_step = ms.jit(train_step)
    rng = np.random.default_rng(0)
    data = [(ms.Tensor(rng.standard_normal((BATCH, CH, HW, HW)).astype(np.float32)),
             ms.Tensor(rng.integers(0, CLASSES, BATCH).astype(np.int32)))
            for _ in range(a.steps)]
    first, last = (int(v) for v in a.profile.split(":"))
    if a.model_train:
        _model_train(a.run_dir, model, loss_fn, optimizer, data, (first, last))
        return
    rec = LoopRecorder(a.run_dir, network=model, optimizer=optimizer,
                       profile_steps=(first, last))
    losses = []
    for x, y in rec.wrap_loader(data):
        with rec.step(x):
            loss = train_step(x, y)
            losses.append(float(loss.asnumpy()))
            rec.log(loss=losses[-1])
    rec.close()
    x, y = data[0]
    (_, _), grads = grad_fn(x, y)
    direct = _direct({"forward": lambda: forward_fn(x, y),
                      "forward_backward": lambda: grad_fn(x, y),
                      "optimizer": lambda: optimizer(grads)}, a.direct)
    print(json.dumps({"direct_ms": direct, "losses": losses}))


if __name__ == "__main__":
    main()
