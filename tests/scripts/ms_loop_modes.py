"""The quick-start PyNative loop recorded by LoopRecorder, told its step functions
(``compiled=[train_step, eval_step]``) so it finds which run under ``@jit``; run by
tests/integrations/test_mindspore_loop_modes.py.

usage: ms_loop_modes.py RUN_DIR [--jit] [--steps N]

``--jit``: ``train_step`` is made by ``mindspore.jit`` (the tutorial's compiled variant);
``eval_step`` never is. Prints ``SS step i=.. loss=..`` lines (the script's own loss).
"""

from __future__ import annotations

import argparse

import mindspore as ms
import numpy as np
from mindspore import nn

from stepscope.integrations.mindspore import LoopRecorder


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--jit", action="store_true")
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    ms.set_device("CPU")
    ms.set_seed(0)
    model = nn.SequentialCell(nn.Flatten(), nn.Dense(28 * 28, 64), nn.ReLU(),
                              nn.Dense(64, 10))
    loss_fn = nn.CrossEntropyLoss()
    optimizer = nn.SGD(model.trainable_params(), 1e-2)

    def forward_fn(data, label):  # type: ignore[no-untyped-def]
        return loss_fn(model(data), label)

    grad_fn = ms.value_and_grad(forward_fn, None, optimizer.parameters)

    def train_step(data, label):  # type: ignore[no-untyped-def]
        loss, grads = grad_fn(data, label)
        optimizer(grads)
        return loss

    def eval_step(data, label):  # type: ignore[no-untyped-def]
        return forward_fn(data, label)

    if a.jit:
        train_step = ms.jit(train_step)
    rng = np.random.default_rng(0)
    rec = LoopRecorder(a.run_dir, network=model, optimizer=optimizer,
                       compiled=[train_step, eval_step])
    for i in range(a.steps):
        x = ms.Tensor(rng.standard_normal((16, 1, 28, 28)).astype(np.float32))
        y = ms.Tensor(rng.integers(0, 10, 16).astype(np.int32))
        with rec.step(x):
            loss = float(train_step(x, y).asnumpy())
            rec.log(loss=loss)
        print(f"SS step i={i} loss={loss!r}", flush=True)
    rec.close()


if __name__ == "__main__":
    main()
