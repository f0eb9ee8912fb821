"""MindSpore quick-start style training (the official tutorial's shapes), unmodified for
stepscope: ``Model.train`` with LossMonitor/TimeMonitor, a PyNative loop on
``value_and_grad``, the same loop with an ``@jit`` step, or a ``TrainOneStepCell`` loop.

usage: ms_quickstart_style.py {model|pynative|jit|cell|graphcell|amp|amp-pynative|noboundary}
       [--steps N]
       [--crash-at K] [--diverge] [--inf-steps I,J,..] [--manager fixed|dynamic]
       [--opt-scale L] [--dp]

The dataset is a ``GeneratorDataset`` over synthetic MNIST-shaped data (28x28 images, 10
classes, batch 16). The script prints its own numbers as ``SS step i=.. loss=..`` lines
(the loss it computed, read with ``asnumpy``) for the tests to compare with the records.
``--crash-at K`` raises inside the K-th step's loss (a ``ValueError`` from a callback in
``model`` mode); ``--diverge`` multiplies the learning rate so the loss explodes.
``amp``: the mixed-precision tutorial's loop (``amp.DynamicLossScaler``, an ``@jit`` step
that skips the update when the gradients are not finite and returns only the loss);
``--inf-steps`` puts an inf into those steps' images (their gradients overflow); the script
prints the scale it read before each step and whether it knew the step would skip.
``amp-pynative``: the same loop without ``@jit`` (a skipped step never calls the optimizer).
``graphcell``: GRAPH mode, a custom loop calling a hand-written ``nn.Cell`` whose
``construct`` runs ``value_and_grad`` and the optimizer (neither a TrainOneStepCell nor
``@jit``).
``--manager``: Model.train with a FixedLossScaleManager(1024, drop_overflow_update=False)
or a DynamicLossScaleManager, the optimizer built with ``loss_scale=--opt-scale``.
``--dp``: data parallel under ``msrun`` (``init()``, DATA_PARALLEL context).
"""

from __future__ import annotations

import argparse
import time

import mindspore as ms
import numpy as np
from mindspore import amp, nn
from mindspore import dataset as ds
from mindspore.train import Callback, LossMonitor, Model, TimeMonitor

BATCH = 16


class Network(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.dense_relu_sequential = nn.SequentialCell(
            nn.Dense(28 * 28, 64), nn.ReLU(), nn.Dense(64, 64), nn.ReLU(), nn.Dense(64, 10))

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return self.dense_relu_sequential(self.flatten(x))


def datapipe(steps: int) -> ds.Dataset:
    rng = np.random.default_rng(0)
    images = rng.standard_normal((steps * BATCH, 1, 28, 28)).astype(np.float32)
    labels = rng.integers(0, 10, steps * BATCH).astype(np.int32)

    def gen():  # type: ignore[no-untyped-def]
        yield from zip(images, labels, strict=True)

    return ds.GeneratorDataset(gen, ["image", "label"], shuffle=False).batch(BATCH)


class PrintLoss(Callback):  # type: ignore[misc]
    """The script's own record of each step's loss (what LossMonitor prints)."""

    def __init__(self, crash_at: int) -> None:
        super().__init__()
        self.crash_at = crash_at

    def on_train_step_end(self, run_context):  # type: ignore[no-untyped-def]
        p = run_context.original_args()
        i = p.cur_step_num - 1
        loss = float(np.asarray(p.net_outputs.asnumpy()).reshape(-1)[0])
        print(f"SS step i={i} loss={loss!r} t={time.perf_counter()!r}", flush=True)
        if i == self.crash_at:
            raise ValueError(f"loss is NAN or INF at step {i}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["model", "pynative", "jit", "cell", "graphcell", "amp",
                                     "amp-pynative", "noboundary"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--crash-at", type=int, default=-1)
    ap.add_argument("--diverge", action="store_true")
    ap.add_argument("--inf-steps", default="")
    ap.add_argument("--manager", choices=["", "fixed", "dynamic"], default="")
    ap.add_argument("--opt-scale", type=float, default=1024.0)
    ap.add_argument("--dp", action="store_true")
    a = ap.parse_args()
    ms.set_device("CPU")
    if a.dp:  # the data-parallel tutorial under msrun: Model.train inserts the grad reducer
        from mindspore.communication import init

        init()
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL,
                                     gradients_mean=True)
    ms.set_seed(1)
    if a.mode in ("model", "graphcell"):
        ms.set_context(mode=ms.GRAPH_MODE)
    lr = 1e-2 * (400.0 if a.diverge else 1.0)
    model = Network()
    loss_fn = nn.CrossEntropyLoss()
    optimizer = nn.SGD(model.trainable_params(), lr, momentum=0.9 if a.diverge else 0.0,
                       loss_scale=a.opt_scale if a.manager else 1.0)
    inf_steps = {int(v) for v in a.inf_steps.split(",") if v}
    data = datapipe(a.steps)
    if a.mode in ("amp", "amp-pynative"):
        return amp_loop(model, loss_fn, optimizer, data, inf_steps, jit=a.mode == "amp")
    if a.mode == "graphcell":
        train_cell = TrainCell(model, loss_fn, optimizer)
        for i, (x, y) in enumerate(data.create_tuple_iterator()):
            loss = train_cell(x, y)
            print(f"SS step i={i} loss={float(loss.asnumpy())!r}", flush=True)
        return
    if a.mode == "model":
        kw = {}
        if a.manager:
            from mindspore.train import DynamicLossScaleManager, FixedLossScaleManager

            kw["loss_scale_manager"] = (
                FixedLossScaleManager(1024.0, drop_overflow_update=False)
                if a.manager == "fixed" else DynamicLossScaleManager(1024.0, 2, 50))
        trainer = Model(model, loss_fn=loss_fn, optimizer=optimizer, **kw)
        trainer.train(1, data, callbacks=[PrintLoss(a.crash_at), LossMonitor(5),
                                          TimeMonitor()], dataset_sink_mode=False)
        return
    if a.mode == "cell":
        step_cell = nn.TrainOneStepCell(nn.WithLossCell(model, loss_fn), optimizer)
        for i, (x, y) in enumerate(data.create_tuple_iterator()):
            loss = step_cell(x, y)
            print(f"SS step i={i} loss={float(loss.asnumpy())!r}", flush=True)
        return

    def forward_fn(data, label):  # type: ignore[no-untyped-def]
        logits = model(data)
        return loss_fn(logits, label), logits

    grad_fn = ms.value_and_grad(forward_fn, None, optimizer.parameters, has_aux=True)

    def train_step(data, label):  # type: ignore[no-untyped-def]
        (loss, _), grads = grad_fn(data, label)
        optimizer(grads)
        return loss

    if a.mode == "jit":
        train_step = ms.jit(train_step)
    model.set_train()
    for i, (x, y) in enumerate(data.create_tuple_iterator()):
        if a.mode == "noboundary":  # forward only: nothing trains, nothing to attach to
            loss = loss_fn(model(x), y)
        else:
            loss = train_step(x, y)
        value = float(loss.asnumpy())
        if i == a.crash_at:
            raise ValueError(f"loss is NAN or INF at step {i}")
        print(f"SS step i={i} loss={value!r}", flush=True)


class TrainCell(nn.Cell):
    """A hand-written training step: value_and_grad and the update in one construct."""

    def __init__(self, net: nn.Cell, loss_fn: nn.Cell, optimizer: nn.Optimizer) -> None:
        super().__init__()
        self.net, self.loss_fn, self.optimizer = net, loss_fn, optimizer
        self.grad_fn = ms.value_and_grad(self.forward, None, optimizer.parameters)

    def forward(self, x: ms.Tensor, y: ms.Tensor) -> ms.Tensor:
        return self.loss_fn(self.net(x), y)

    def construct(self, x: ms.Tensor, y: ms.Tensor) -> ms.Tensor:
        loss, grads = self.grad_fn(x, y)
        self.optimizer(grads)
        return loss


def amp_loop(model: nn.Cell, loss_fn: nn.Cell, optimizer: nn.Optimizer, data: ds.Dataset,
             inf_steps: set[int], jit: bool = True) -> None:
    loss_scaler = amp.DynamicLossScaler(scale_value=2.0**10, scale_factor=2, scale_window=50)

    def forward_fn(data, label):  # type: ignore[no-untyped-def]
        logits = model(data)
        loss = loss_fn(logits, label)
        return loss_scaler.scale(loss), logits

    grad_fn = ms.value_and_grad(forward_fn, None, optimizer.parameters, has_aux=True)

    def train_step(data, label):  # type: ignore[no-untyped-def]
        (loss, _), grads = grad_fn(data, label)
        loss = loss_scaler.unscale(loss)
        is_finite = amp.all_finite(grads)
        if is_finite:
            grads = loss_scaler.unscale(grads)
            optimizer(grads)
        loss_scaler.adjust(is_finite)
        return loss

    if jit:
        train_step = ms.jit(train_step)

    model.set_train()
    for i, (x, y) in enumerate(data.create_tuple_iterator()):
        if i in inf_steps:
            x = x * ms.Tensor(np.float32(np.inf))
        scale = float(loss_scaler.scale_value.asnumpy())
        loss = train_step(x, y)
        print(f"SS step i={i} loss={float(loss.asnumpy())!r} scale={scale!r} "
              f"skipped={i in inf_steps!r}", flush=True)


if __name__ == "__main__":
    main()
