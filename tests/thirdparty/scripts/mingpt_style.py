"""A training script in the style of karpathy/minGPT (third-party fixture).

Written for stepscope's third-party suite, not copied: minGPT's ``Trainer`` (a
``DataLoader`` over a ``RandomSampler`` with replacement, worker processes, ``pin_memory``,
AdamW with decay / no-decay groups, ``clip_grad_norm_``, callbacks fired on
``on_batch_end``), a model whose forward returns ``(logits, loss)`` and a
``@torch.no_grad() generate()``; the script's callback samples from the model every
``--gen-every`` iterations (``model.eval()`` ... ``model.train()``), as minGPT's chargpt
project does between training steps.

Its own numbers: ``SS step`` after each optimizer step (loss, lr, the pre-clip norm
clip_grad_norm_ returned, perf_counter), ``SS eval`` for each generate() with its duration
and the number of steps done before it, ``SS done``.
"""

import argparse
import time

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, RandomSampler

p = argparse.ArgumentParser()
p.add_argument("--max-iters", type=int, default=12)
p.add_argument("--gen-every", type=int, default=4)
p.add_argument("--workers", type=int, default=2)
p.add_argument("--new-tokens", type=int, default=300)
args = p.parse_args()

VOCAB, BLOCK, EMBD = 48, 16, 48


def say(kind, **kv):
    # the line and its newline in one write: ranks share this stdout, unbuffered under torchrun
    print("SS " + kind + "".join(f" {k}={v!r}" for k, v in kv.items()) + "\n", end="", flush=True)


class CharDataset(Dataset):
    def __init__(self, n=5000):
        self.data = torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(3))

    def __len__(self):
        return len(self.data) - BLOCK - 1

    def __getitem__(self, i):
        chunk = self.data[i:i + BLOCK + 1]
        return chunk[:-1], chunk[1:]


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, EMBD)
        self.pos = nn.Parameter(torch.zeros(1, BLOCK, EMBD))
        layer = nn.TransformerEncoderLayer(EMBD, 4, 4 * EMBD, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(EMBD, VOCAB, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(BLOCK))

    def forward(self, idx, targets=None):
        t = idx.size(1)
        x = self.tok(idx) + self.pos[:, :t]
        x = self.blocks(x, mask=self.mask[:t, :t], is_causal=True)
        logits = self.head(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))
        return logits, loss

    @torch.no_grad()
    def generate(self, idx, max_new_tokens):
        for _ in range(max_new_tokens):
            logits, _ = self(idx[:, -BLOCK:])
            probs = F.softmax(logits[:, -1, :], dim=-1)
            idx = torch.cat((idx, torch.multinomial(probs, num_samples=1)), dim=1)
        return idx

    def configure_optimizers(self, lr, weight_decay=0.1):
        decay = [p for n, p in self.named_parameters() if n.endswith("weight") and p.dim() >= 2]
        other = [p for n, p in self.named_parameters() if not (n.endswith("weight")
                                                               and p.dim() >= 2)]
        return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                  {"params": other, "weight_decay": 0.0}],
                                 lr=lr, betas=(0.9, 0.95))


class Trainer:
    def __init__(self, model, dataset, max_iters, batch_size=8, lr=5e-4, workers=2):
        self.model, self.dataset = model, dataset
        self.max_iters, self.batch_size, self.lr, self.workers = max_iters, batch_size, lr, workers
        self.callbacks = {}

    def add_callback(self, event, fn):
        self.callbacks.setdefault(event, []).append(fn)

    def trigger_callbacks(self, event):
        for fn in self.callbacks.get(event, []):
            fn(self)

    def run(self):
        model = self.model
        self.optimizer = model.configure_optimizers(self.lr)
        loader = DataLoader(self.dataset, shuffle=False, pin_memory=True,
                            batch_size=self.batch_size, num_workers=self.workers,
                            sampler=RandomSampler(self.dataset, replacement=True,
                                                  num_samples=int(1e10)))
        model.train()
        self.iter_num = 0
        data_iter = iter(loader)
        while True:
            try:
                x, y = next(data_iter)
            except StopIteration:
                data_iter = iter(loader)
                x, y = next(data_iter)
            _, self.loss = model(x, y)
            model.zero_grad(set_to_none=True)
            self.loss.backward()
            self.grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            self.optimizer.step()
            self.trigger_callbacks("on_batch_end")
            self.iter_num += 1
            if self.iter_num >= self.max_iters:
                break


def batch_end_callback(trainer):
    say("step", step=trainer.iter_num, loss=trainer.loss.item(),
        lr=trainer.optimizer.param_groups[0]["lr"], grad_norm=trainer.grad_norm.item(),
        t=time.perf_counter())
    if (trainer.iter_num + 1) % args.gen_every == 0:
        t = time.perf_counter()
        trainer.model.eval()
        start = torch.zeros(4, 1, dtype=torch.long)
        trainer.model.generate(start, max_new_tokens=args.new_tokens)
        trainer.model.train()
        say("eval", after_step=trainer.iter_num + 1, seconds=time.perf_counter() - t)


if __name__ == "__main__":
    torch.manual_seed(3407)
    trainer = Trainer(GPT(), CharDataset(), args.max_iters, workers=args.workers)
    trainer.add_callback("on_batch_end", batch_end_callback)
    trainer.run()
    say("done", steps=trainer.iter_num)
