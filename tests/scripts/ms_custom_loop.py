"""A custom MindSpore training loop on ``value_and_grad`` measured by LoopRecorder.

usage: ms_custom_loop.py RUN_DIR [--steps N] [--profile A:B] [--no-loss] [--dp] [--even]
       [--self-sync]

GRAPH mode, CPU: forward+backward and the update are two compiled functions, each timed by
this script itself (epoch seconds) so the tests can check the profile's phase split against
them. ``mindspore.amp.DynamicLossScaler`` scales the loss. --dp: data parallel under msrun
(gradients all-reduced by a DistributedGradReducer in the "comm" phase; rank 1 is slowed
by 100 ms of sleep inside its forward/backward phase, a simulated straggler).
--even: no straggler. --width/--batch: model width and batch (bigger steps).
--self-sync: the script's own synced measurement: it calls
``mindspore.runtime.synchronize()`` after every phase of every step, prints
``SS step i=.. fb=.. comm=.. opt=.. total=..`` (perf_counter seconds) and asks LoopRecorder
for no syncs of its own (``sync_every=0``).
Prints one JSON line with the self-timed windows per step.
"""

from __future__ import annotations

import argparse
import json
import time

import mindspore as ms
import numpy as np
from mindspore import amp, nn

from stepscope.integrations.mindspore import LoopRecorder

VOCAB, SEQ, D, BATCH = 64, 16, 32, 4
STRAGGLER_SLEEP_S = 0.1


class TinyLM(nn.Cell):
    def __init__(self, d: int = D) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.fc = nn.Dense(d, 4 * d)
        self.act = nn.GELU()
        self.out = nn.Dense(4 * d, VOCAB)
        self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, x: ms.Tensor, y: ms.Tensor) -> ms.Tensor:
        h = self.out(self.act(self.fc(self.emb(x))))
        return self.ce(h.reshape(-1, VOCAB), y.reshape(-1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--profile", default="")
    ap.add_argument("--no-loss", action="store_true")
    ap.add_argument("--dp", action="store_true")
    ap.add_argument("--even", action="store_true")
    ap.add_argument("--self-sync", action="store_true")
    ap.add_argument("--width", type=int, default=D)
    ap.add_argument("--batch", type=int, default=BATCH)
    a = ap.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    rank, reducer = 0, None
    if a.dp:
        from mindspore.communication import get_group_size, get_rank, init

        init()
        rank = get_rank()
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL,
                                     gradients_mean=True)
    ms.set_seed(0)
    net = TinyLM(a.width)
    opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-3)
    scaler = amp.DynamicLossScaler(scale_value=2.0**10, scale_factor=2, scale_window=50)
    if a.dp:
        reducer = nn.DistributedGradReducer(opt.parameters, mean=True, degree=get_group_size())

    def scaled_loss(x: ms.Tensor, y: ms.Tensor) -> ms.Tensor:
        return scaler.scale(net(x, y))

    grad_fn = ms.value_and_grad(scaled_loss, None, opt.parameters)

    @ms.jit  # type: ignore[misc]
    def forward_backward(x, y):  # type: ignore[no-untyped-def]
        loss, grads = grad_fn(x, y)
        return scaler.unscale(loss), scaler.unscale(grads)

    @ms.jit  # type: ignore[misc]
    def update(grads):  # type: ignore[no-untyped-def]
        finite = amp.all_finite(grads)
        scaler.adjust(finite)
        opt(grads)
        return finite

    rng = np.random.default_rng(rank)
    data = []
    for _ in range(a.steps):
        x = rng.integers(0, VOCAB, (a.batch, SEQ)).astype(np.int32)
        data.append((ms.Tensor(x), ms.Tensor(np.roll(x, -1, axis=1))))
    prof = tuple(int(v) for v in a.profile.split(":")) if a.profile else None
    rec = LoopRecorder(a.run_dir, network=net, optimizer=opt, scaler=scaler,
                       profile_steps=prof, cross_rank_every=4 if a.dp else 0,  # type: ignore
                       meta={"baseline": {"seq_len": SEQ, "vocab_size": VOCAB}},
                       sync_every=0 if a.self_sync else 10)
    windows = []
    own_sync = ms.runtime.synchronize if a.self_sync else (lambda: None)
    for i, (x, y) in enumerate(rec.wrap_loader(data)):
        with rec.step(x) as s:
            w: dict[str, float] = {}
            t0 = time.perf_counter()
            with s.phase("forward_backward"):
                w["fb_start"] = time.time()
                loss, grads = forward_backward(x, y)
                loss_value = float(loss.asnumpy())
                if a.dp and rank == 1 and not a.even:
                    time.sleep(STRAGGLER_SLEEP_S)
                own_sync()
                w["fb_end"] = time.time()
            t1 = time.perf_counter()
            if reducer is not None:
                with s.phase("comm"):
                    grads = reducer(ms.mutable(grads))
                    own_sync()
            t2 = time.perf_counter()
            with s.phase("optimizer"):
                w["opt_start"] = time.time()
                finite = update(ms.mutable(grads))
                finite.asnumpy()
                w["opt_end"] = time.time()
            t3 = time.perf_counter()
            rec.log(grads=grads, overflow=~finite,
                    **({} if a.no_loss else {"loss": loss_value}))
            windows.append(w)
        if a.self_sync:
            print(f"SS step i={i} fb={t1 - t0!r} comm={t2 - t1!r} opt={t3 - t2!r} "
                  f"total={time.perf_counter() - t0!r}", flush=True)
    rec.close()
    print(json.dumps({"rank": rank, "windows": windows}))


if __name__ == "__main__":
    main()
