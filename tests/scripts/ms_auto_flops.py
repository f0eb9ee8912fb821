"""Tutorial-style MindSpore training whose FLOPs stepscope must count by itself; run by the
tests (tests/integrations/test_mindspore_autoflops.py).

usage: ms_auto_flops.py RUN_DIR {cnn|mlp} {model|traincell|customcell|loop}
                        [--steps N] [--callback]

cnn: the LeNet-5 of MindSpore's tutorials (32x32 grey images, batch 8) with a BatchNorm2d
and a Dropout, so a count that moved their state would change the losses; mlp: the
quick-start network (28x28 images, 784-64-64-10, batch 16). ``model``: ``Model.train``
in GRAPH mode; ``traincell``: ``Model`` over a ``TrainOneStepCell(WithLossCell(...))``;
``customcell``: ``Model`` over a hand-written training cell (no forward network known);
``loop``: the PyNative quick-start loop (``value_and_grad`` + ``optimizer(grads)``).
``--callback`` passes a StepscopeCallback (else the script knows nothing of stepscope:
run it under ``stepscope run``, or bare for the reference losses). Prints
``SS step i=.. loss=..`` lines, the loss read by the script itself.
"""

from __future__ import annotations

import argparse

import mindspore as ms
import numpy as np
from mindspore import dataset as ds
from mindspore import nn
from mindspore.train import Callback, Model


class LeNet5(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, pad_mode="valid")
        self.bn1 = nn.BatchNorm2d(6)
        self.conv2 = nn.Conv2d(6, 16, 5, pad_mode="valid")
        self.relu = nn.ReLU()
        self.max_pool2d = nn.MaxPool2d(kernel_size=2, stride=2)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Dense(16 * 5 * 5, 120)
        self.fc2 = nn.Dense(120, 84)
        self.drop = nn.Dropout(p=0.5)
        self.fc3 = nn.Dense(84, 10)

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        x = self.max_pool2d(self.relu(self.bn1(self.conv1(x))))
        x = self.max_pool2d(self.relu(self.conv2(x)))
        x = self.relu(self.fc1(self.flatten(x)))
        return self.fc3(self.drop(self.relu(self.fc2(x))))


class Mlp(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.dense_relu_sequential = nn.SequentialCell(
            nn.Dense(28 * 28, 64), nn.ReLU(), nn.Dense(64, 64), nn.ReLU(), nn.Dense(64, 10))

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return self.dense_relu_sequential(self.flatten(x))


class CustomTrainCell(nn.Cell):
    def __init__(self, net: nn.Cell, loss_fn: nn.Cell, opt: nn.Optimizer) -> None:
        super().__init__()
        self.net, self.loss_fn, self.opt = net, loss_fn, opt
        self.grad = ms.value_and_grad(self.forward, None, opt.parameters)

    def forward(self, x: ms.Tensor, y: ms.Tensor) -> ms.Tensor:
        return self.loss_fn(self.net(x), y)

    def construct(self, x: ms.Tensor, y: ms.Tensor) -> ms.Tensor:
        loss, grads = self.grad(x, y)
        self.opt(grads)
        return loss


class PrintLoss(Callback):  # type: ignore[misc]
    def on_train_step_end(self, run_context):  # type: ignore[no-untyped-def]
        p = run_context.original_args()
        out = p.net_outputs
        loss = out[0] if isinstance(out, (tuple, list)) else out
        print(f"SS step i={p.cur_step_num - 1} loss={float(loss.asnumpy())!r}", flush=True)


def datapipe(net: str, steps: int) -> ds.Dataset:
    side, batch = (32, 8) if net == "cnn" else (28, 16)
    rng = np.random.default_rng(0)
    images = rng.standard_normal((steps * batch, 1, side, side)).astype(np.float32)
    labels = rng.integers(0, 10, steps * batch).astype(np.int32)

    def gen():  # type: ignore[no-untyped-def]
        yield from zip(images, labels, strict=True)

    return ds.GeneratorDataset(gen, ["image", "label"], shuffle=False).batch(batch)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("net", choices=["cnn", "mlp"])
    ap.add_argument("mode", choices=["model", "traincell", "customcell", "loop"])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--callback", action="store_true")
    a = ap.parse_args()
    ms.set_device("CPU")
    if a.mode != "loop":
        ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    net = LeNet5() if a.net == "cnn" else Mlp()
    loss_fn = nn.CrossEntropyLoss()
    opt = nn.Momentum(net.trainable_params(), 1e-2, 0.9)
    data = datapipe(a.net, a.steps)
    if a.mode == "loop":
        return loop(net, loss_fn, opt, data)
    if a.mode == "model":
        model = Model(net, loss_fn=loss_fn, optimizer=opt)
    elif a.mode == "traincell":
        model = Model(nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), opt))
    else:
        model = Model(CustomTrainCell(net, loss_fn, opt))
    cbs: list[Callback] = [PrintLoss()]
    if a.callback:
        from stepscope.integrations.mindspore import StepscopeCallback

        cbs.append(StepscopeCallback(a.run_dir))
    model.train(1, data, callbacks=cbs, dataset_sink_mode=False)


def loop(net: nn.Cell, loss_fn: nn.Cell, optimizer: nn.Optimizer, data: ds.Dataset) -> None:
    def forward_fn(data, label):  # type: ignore[no-untyped-def]
        logits = net(data)
        return loss_fn(logits, label), logits

    grad_fn = ms.value_and_grad(forward_fn, None, optimizer.parameters, has_aux=True)

    def train_step(data, label):  # type: ignore[no-untyped-def]
        (loss, _), grads = grad_fn(data, label)
        optimizer(grads)
        return loss

    net.set_train()
    for i, (x, y) in enumerate(data.create_tuple_iterator()):
        loss = train_step(x, y)
        print(f"SS step i={i} loss={float(loss.asnumpy())!r}", flush=True)


if __name__ == "__main__":
    main()
