"""FLOPs counted from MindSpore networks (a small CNN and an MLP), and a short LoopRecorder
run of the CNN whose run.json carries the counted FLOPs (for its MFU).

usage: ms_flops.py RUN_DIR [--graph]

Prints one JSON line: {"cnn": {total, by_cell}, "mlp": {...}, "attn": {...}}.
"""

from __future__ import annotations

import argparse
import json

import mindspore as ms
import numpy as np
from mindspore import nn

from stepscope.integrations.mindspore import LoopRecorder
from stepscope.integrations.mindspore.flopcount import flops_fields, forward_flops

BATCH = 8


class CNN(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, pad_mode="same")
        self.conv2 = nn.Conv2d(16, 32, 3, stride=2, pad_mode="same", group=2)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.dense = nn.Dense(32 * 8 * 8, 10)

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return self.dense(self.flatten(self.relu(self.conv2(self.relu(self.conv1(x))))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--graph", action="store_true")
    a = ap.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if a.graph else ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    ms.set_seed(0)
    rng = np.random.default_rng(0)
    cnn = CNN()
    mlp = nn.SequentialCell(nn.Flatten(), nn.Dense(768, 256), nn.ReLU(), nn.Dense(256, 10))
    attn = nn.MultiheadAttention(32, 4, batch_first=True)
    x = ms.Tensor(rng.standard_normal((BATCH, 3, 16, 16)).astype(np.float32))
    q = ms.Tensor(rng.standard_normal((4, 12, 32)).astype(np.float32))
    kv = ms.Tensor(rng.standard_normal((4, 20, 32)).astype(np.float32))
    counts = {"cnn": forward_flops(cnn, x), "mlp": forward_flops(mlp, x),
              "attn": forward_flops(attn, q, kv, kv)}
    opt = nn.Momentum(cnn.trainable_params(), 0.01, 0.9)
    loss_fn = nn.CrossEntropyLoss()

    def forward_fn(data: ms.Tensor, label: ms.Tensor) -> ms.Tensor:
        return loss_fn(cnn(data), label)

    grad_fn = ms.value_and_grad(forward_fn, None, opt.parameters)
    rec = LoopRecorder(a.run_dir, network=cnn, optimizer=opt,
                       meta={"environment": flops_fields(counts["cnn"], samples=BATCH)})
    y = ms.Tensor(rng.integers(0, 10, BATCH).astype(np.int32))
    for _ in rec.wrap_loader(range(6)):
        with rec.step(x):
            loss, grads = grad_fn(x, y)
            opt(grads)
            rec.log(loss=loss)
    rec.close()
    print(json.dumps({k: {"total": c.total, "by_cell": c.by_cell} for k, c in counts.items()}))


if __name__ == "__main__":
    main()
