"""A policy-gradient-style loop: the trained model samples under ``torch.no_grad()`` before
every optimizer step (third-party fixture, in the style of RL fine-tuning loops: a rollout,
then a training forward on what it produced).

Written for stepscope's third-party suite: a small next-token model; each iteration
takes a batch of prompts from a DataLoader, samples ``--new-tokens`` tokens
autoregressively for them (no loss: the rollout), then trains on the sampled sequences
(cross-entropy times a made-up reward), AdamW; every ``--eval-every`` iterations, before
the rollout, a held-out evaluation under ``model.eval()`` computes a loss (the evaluation
stepscope books apart).

Its own numbers: ``SS step`` per optimizer step (the objective backward ran on,
perf_counter after the step, the rollout's seconds), ``SS eval`` per evaluation (steps
done before it, loss, seconds), ``SS done``.
"""

import argparse
import time

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--iters", type=int, default=10)
p.add_argument("--eval-every", type=int, default=4)
p.add_argument("--new-tokens", type=int, default=24)
args = p.parse_args()

VOCAB, DIM, BATCH, PROMPT = 64, 128, 16, 4


def say(kind, **kv):
    # the line and its newline in one write: ranks share this stdout, unbuffered under torchrun
    print("SS " + kind + "".join(f" {k}={v!r}" for k, v in kv.items()) + "\n", end="", flush=True)


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, idx, targets=None):
        h = self.emb(idx)
        h = h + self.mlp(h)
        logits = self.head(h)
        if targets is None:
            return logits
        return logits, nn.functional.cross_entropy(logits.reshape(-1, VOCAB),
                                                   targets.reshape(-1))


torch.manual_seed(0)
model = Policy()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
gen = torch.Generator().manual_seed(1)
held_out = torch.randint(0, VOCAB, (64, PROMPT + args.new_tokens + 1), generator=gen)
prompts = torch.utils.data.DataLoader(
    torch.randint(0, VOCAB, (BATCH * args.iters, PROMPT), generator=gen), batch_size=BATCH)

for it, seq in enumerate(prompts):
    if it % args.eval_every == 0 and it:
        t = time.perf_counter()
        model.eval()
        with torch.no_grad():
            _, val = model(held_out[:, :-1], held_out[:, 1:])
        model.train()
        say("eval", after_step=it, loss=val.item(), seconds=time.perf_counter() - t)
    t = time.perf_counter()
    with torch.no_grad():  # the rollout: sampled with the policy being trained
        for _ in range(args.new_tokens):
            probs = torch.softmax(model(seq)[:, -1], dim=-1)
            seq = torch.cat([seq, torch.multinomial(probs, 1, generator=gen)], dim=1)
    rollout = time.perf_counter() - t
    reward = (seq[:, PROMPT:] % 2 == 0).float().mean()
    _, loss = model(seq[:, :-1], seq[:, 1:])
    objective = loss * reward
    opt.zero_grad()
    objective.backward()
    opt.step()
    say("step", step=it, loss=objective.item(), t=time.perf_counter(), rollout=rollout)
say("done", steps=args.iters)
