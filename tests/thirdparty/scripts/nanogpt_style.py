"""A training script in the style of karpathy/nanoGPT's train.py (third-party fixture).

Written for stepscope's third-party suite, not copied: a tiny tied-embedding GPT, tokens
read from an ``np.memmap`` by ``get_batch``, gradient accumulation with the loss divided
by the accumulation count, a (disabled, fp32) GradScaler, ``clip_grad_norm_`` after
``unscale_``, a warmup + cosine lr written into the param groups, ``estimate_loss()`` under
``model.eval()``/``no_grad`` every ``--eval-interval`` iterations followed by a checkpoint
save, and nanoGPT's ``estimate_mfu`` (PaLM appendix B: 6N + 12LHQT, N without the
position embedding).

Its own numbers, one line each, ``SS <kind> key=value ...`` with ``repr`` floats:
``SS step`` after each optimizer step (loss = mean over the step's micro-batches, the
pre-clip grad norm that clip_grad_norm_ returned, lr, perf_counter), ``SS eval`` and
``SS checkpoint`` with their durations and the number of steps done before them (and
the eval's val and train losses),
``SS mfu`` with the script's FLOPs per token, ``SS done``.
"""

import argparse
import math
import os
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

p = argparse.ArgumentParser()
p.add_argument("--max-iters", type=int, default=10)
p.add_argument("--accum", type=int, default=4)
p.add_argument("--batch", type=int, default=4)
p.add_argument("--block", type=int, default=16)
p.add_argument("--eval-interval", type=int, default=5)
p.add_argument("--eval-iters", type=int, default=30)
p.add_argument("--out-dir", default="")
args = p.parse_args()


def say(kind, **kv):
    # the line and its newline in one write: ranks share this stdout, unbuffered under torchrun
    print("SS " + kind + "".join(f" {k}={v!r}" for k, v in kv.items()) + "\n", end="", flush=True)


VOCAB, N_LAYER, N_HEAD, N_EMBD = 64, 2, 2, 32


@dataclass
class GPTConfig:  # nanoGPT keeps the model's shape in model.config
    block_size: int = args.block
    vocab_size: int = VOCAB
    n_layer: int = N_LAYER
    n_head: int = N_HEAD
    n_embd: int = N_EMBD
out_dir = args.out_dir or tempfile.mkdtemp(prefix="nanogpt-")
torch.manual_seed(1337)
rng = np.random.default_rng(1337)
for split, n in (("train", 20_000), ("val", 4_000)):
    rng.integers(0, VOCAB, n, dtype=np.uint16).tofile(os.path.join(out_dir, f"{split}.bin"))


def get_batch(split):
    data = np.memmap(os.path.join(out_dir, f"{split}.bin"), dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - args.block, (args.batch,))
    x = torch.stack([torch.from_numpy(data[i:i + args.block].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + args.block].astype(np.int64))
                     for i in ix])
    return x, y


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(N_EMBD), nn.LayerNorm(N_EMBD)
        self.c_attn = nn.Linear(N_EMBD, 3 * N_EMBD)
        self.c_proj = nn.Linear(N_EMBD, N_EMBD)
        self.mlp = nn.Sequential(nn.Linear(N_EMBD, 4 * N_EMBD), nn.GELU(),
                                 nn.Linear(4 * N_EMBD, N_EMBD))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(N_EMBD, dim=2)
        q, k, v = (t.view(B, T, N_HEAD, C // N_HEAD).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.config = GPTConfig()
        self.wte = nn.Embedding(VOCAB, N_EMBD)
        self.wpe = nn.Embedding(args.block, N_EMBD)
        self.h = nn.ModuleList(Block() for _ in range(N_LAYER))
        self.ln_f = nn.LayerNorm(N_EMBD)
        self.lm_head = nn.Linear(N_EMBD, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as nanoGPT
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(
            logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def get_num_params(self):
        return sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()

    def flops_per_token(self):
        # nanoGPT's estimate_mfu: PaLM appendix B, 6N + 12 * L * H * Q * T
        L, H, Q, T = N_LAYER, N_HEAD, N_EMBD // N_HEAD, args.block
        return 6 * self.get_num_params() + 12 * L * H * Q * T


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ("train", "val"):
        losses = torch.zeros(args.eval_iters)
        for k in range(args.eval_iters):
            X, Y = get_batch(split)
            _, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean().item()
    model.train()
    return out


def get_lr(it, lr=1e-3, warmup=3, min_lr=1e-4):
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    ratio = (it - warmup) / max(1, args.max_iters - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * min(1.0, ratio))) * (lr - min_lr)


model = GPT()
decay = [p for p in model.parameters() if p.dim() >= 2]
no_decay = [p for p in model.parameters() if p.dim() < 2]
optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                               {"params": no_decay, "weight_decay": 0.0}],
                              lr=1e-3, betas=(0.9, 0.95))
scaler = torch.amp.GradScaler("cuda", enabled=False)  # nanoGPT: enabled only for float16
say("mfu", flops_per_token=model.flops_per_token(),
    flops_per_iter=model.flops_per_token() * args.block * args.batch * args.accum,
    num_params=model.get_num_params())

X, Y = get_batch("train")
iter_num, steps_done = 0, 0
while True:
    lr = get_lr(iter_num)
    for group in optimizer.param_groups:
        group["lr"] = lr
    if iter_num % args.eval_interval == 0:
        t = time.perf_counter()
        losses = estimate_loss()
        say("eval", after_step=steps_done, seconds=time.perf_counter() - t,
            loss=losses["val"], train=losses["train"])
        if iter_num > 0:
            t = time.perf_counter()
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "iter_num": iter_num}, os.path.join(out_dir, "ckpt.pt"))
            say("checkpoint", after_step=steps_done, seconds=time.perf_counter() - t)
    t_train = time.perf_counter()
    micro_losses = []
    for _ in range(args.accum):
        _, loss = model(X, Y)
        loss = loss / args.accum
        micro_losses.append(loss.item() * args.accum)
        X, Y = get_batch("train")
        scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    say("step", step=steps_done, loss=sum(micro_losses) / len(micro_losses),
        lr=lr, grad_norm=norm.item(), micro=args.accum, t_train=t_train,
        t=time.perf_counter())
    steps_done += 1
    iter_num += 1
    if iter_num > args.max_iters:
        break
say("done", steps=steps_done)
