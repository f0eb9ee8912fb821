"""MindSpore Model.train (GRAPH mode, CPU) measured by StepscopeCallback; run by the tests.

usage: ms_model_train.py RUN_DIR [--steps N] [--epochs E] [--profile A:B] [--custom-cell]
                          [--loss-scale S] [--dp]

Prints one JSON line: the step windows this script timed itself (epoch seconds, from a
separate callback registered before stepscope's) and the process CPU seconds
(``time.process_time``) spent inside ``Model.train``, for the tests to compare with.
--custom-cell trains through a hand-written training cell that returns the logits instead
of the loss (the field report's failure mode). --dp: data parallel under msrun (the
gradient all-reduce runs inside the compiled graph), cross-rank gather every 2 steps.
"""

from __future__ import annotations

import argparse
import json
import time

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.train import Callback, FixedLossScaleManager, Model

from stepscope.integrations.mindspore.callback import StepscopeCallback

VOCAB, SEQ, D, BATCH = 64, 16, 32, 4


class TinyLM(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.fc = nn.Dense(D, 4 * D)
        self.act = nn.GELU()
        self.out = nn.Dense(4 * D, VOCAB)

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        h = self.out(self.act(self.fc(self.emb(x))))
        return h.reshape(-1, VOCAB)


class FlatLoss(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, logits: ms.Tensor, y: ms.Tensor) -> ms.Tensor:
        return self.ce(logits, y.reshape(-1))


class LogitsTrainCell(nn.Cell):
    """A custom training cell that updates the weights but returns the logits."""

    def __init__(self, net: nn.Cell, loss: nn.Cell, opt: nn.Optimizer) -> None:
        super().__init__()
        self.net, self.loss, self.opt = net, loss, opt
        self.grad = ms.value_and_grad(self._loss, None, opt.parameters)

    def _loss(self, x: ms.Tensor, y: ms.Tensor) -> ms.Tensor:
        return self.loss(self.net(x), y)

    def construct(self, x: ms.Tensor, y: ms.Tensor) -> ms.Tensor:
        _, grads = self.grad(x, y)
        self.opt(grads)
        return self.net(x)


class GradNormFirstCell(LogitsTrainCell):
    """A custom training cell returning (grad_norm, loss): the first scalar is no loss."""

    def construct(self, x: ms.Tensor, y: ms.Tensor):  # type: ignore[no-untyped-def]
        loss, grads = self.grad(x, y)
        self.opt(grads)
        norm = ms.ops.sqrt(ms.ops.addn([ms.ops.sum(ms.ops.square(g)) for g in grads]))
        return norm, loss


class Windows(Callback):
    def __init__(self, crash_at: int = -1) -> None:
        self.rows: list[list[float]] = []
        self.crash_at = crash_at

    def on_train_step_begin(self, run_context):  # type: ignore[no-untyped-def]
        self.rows.append([time.time(), float("nan")])

    def on_train_step_end(self, run_context):  # type: ignore[no-untyped-def]
        self.rows[-1][1] = time.time()
        if len(self.rows) - 1 == self.crash_at:  # as LossMonitor does on a NaN loss
            raise ValueError(f"epoch: 1 step: {self.crash_at + 1}. Invalid loss, terminating "
                             "training.")


def batches(n: int):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    for _ in range(n):
        x = rng.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int32)
        yield x, np.roll(x, -1, axis=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--profile", default="")
    ap.add_argument("--custom-cell", action="store_true")
    ap.add_argument("--loss-scale", type=float, default=0.0)
    ap.add_argument("--dp", action="store_true")
    ap.add_argument("--crash-at", type=int, default=-1)
    ap.add_argument("--grad-norm-first", action="store_true")
    a = ap.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    if a.dp:
        from mindspore.communication import init

        init()
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL,
                                     gradients_mean=True)
    ms.set_seed(0)
    data = ds.GeneratorDataset(lambda: batches(a.steps), ["x", "y"], shuffle=False)
    net, loss = TinyLM(), FlatLoss()
    opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-3)
    if a.custom_cell:
        model = Model(LogitsTrainCell(net, loss, opt))
    elif a.grad_norm_first:
        model = Model(GradNormFirstCell(net, loss, opt))
    elif a.loss_scale:
        model = Model(net, loss, opt, loss_scale_manager=FixedLossScaleManager(
            a.loss_scale, drop_overflow_update=False))
    else:
        model = Model(net, loss, opt)
    prof = tuple(int(v) for v in a.profile.split(":")) if a.profile else None
    windows = Windows(a.crash_at)
    cb = StepscopeCallback(a.run_dir, profile_steps=prof,  # type: ignore[arg-type]
                           cross_rank_every=2 if a.dp else 0,
                           meta={"baseline": {"seq_len": SEQ, "vocab_size": VOCAB}})
    cpu0 = time.process_time()
    model.train(a.epochs, data, callbacks=[windows, cb], dataset_sink_mode=False)
    print(json.dumps({"windows": windows.rows, "cpu_s": time.process_time() - cpu0}))


if __name__ == "__main__":
    main()
