"""A training script in the style of pytorch/examples word_language_model (third-party
fixture).

Written for stepscope's third-party suite, not copied: ``batchify`` lays the corpus out
sequence-first (``[seq, batch]``), ``get_batch`` slices ``bptt`` rows, an LSTM language
model with its own embedding and decoder (untied), hidden state carried across batches,
``clip_grad_norm_`` then, by default, a manual SGD update ``p.data.add_(-lr * p.grad)``
(no torch.optim; ``--use-optimizer`` steps AdamW instead, as the example's flag does),
``evaluate()`` on validation data under ``model.eval()``/``no_grad`` after every epoch,
and ``torch.save(model, f)`` of the whole model when validation improves (``--save ''``
skips it), loaded back with ``torch.load``.

Its own numbers: ``SS step`` per update (loss, lr, the pre-clip norm clip_grad_norm_
returned, perf_counter), ``SS eval`` / ``SS checkpoint`` with durations and the number of
updates before them, ``SS model`` (parameter counts, batch and bptt), ``SS done``.
"""

import argparse
import time

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--lr", type=float, default=20.0)
p.add_argument("--clip", type=float, default=0.25)
p.add_argument("--batch-size", type=int, default=4)
p.add_argument("--bptt", type=int, default=12)
p.add_argument("--save", default="model.pt")
p.add_argument("--use-optimizer", action="store_true")
args = p.parse_args()

NTOKEN, EMSIZE, NHID = 200, 64, 64


def say(kind, **kv):
    # the line and its newline in one write: ranks share this stdout, unbuffered under torchrun
    print("SS " + kind + "".join(f" {k}={v!r}" for k, v in kv.items()) + "\n", end="", flush=True)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    return data[:nbatch * bsz].view(bsz, -1).t().contiguous()


def get_batch(source, i):
    seq_len = min(args.bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


class RNNModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Embedding(NTOKEN, EMSIZE)
        self.rnn = nn.LSTM(EMSIZE, NHID, 2)
        self.decoder = nn.Linear(NHID, NTOKEN)

    def forward(self, inp, hidden):
        output, hidden = self.rnn(self.encoder(inp), hidden)
        decoded = self.decoder(output).view(-1, NTOKEN)
        return nn.functional.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        w = next(self.parameters())
        return (w.new_zeros(2, bsz, NHID), w.new_zeros(2, bsz, NHID))


def repackage_hidden(h):
    return tuple(v.detach() for v in h)


torch.manual_seed(1111)
corpus = torch.randint(0, NTOKEN, (4 * 12 * 10 + 1,))
train_data = batchify(corpus, args.batch_size)
val_data = batchify(torch.randint(0, NTOKEN, (8001,)), 10)
model = RNNModel()
criterion = nn.NLLLoss()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3) if args.use_optimizer else None
say("model", num_params=sum(p.numel() for p in model.parameters()),
    embedding_params=model.encoder.weight.numel(), batch=args.batch_size, bptt=args.bptt)
updates = 0


def evaluate(source):
    model.eval()
    total, hidden = 0.0, model.init_hidden(10)
    with torch.no_grad():
        for i in range(0, source.size(0) - 1, args.bptt):
            data, targets = get_batch(source, i)
            output, hidden = model(data, hidden)
            hidden = repackage_hidden(hidden)
            total += len(data) * criterion(output, targets).item()
    return total / (len(source) - 1)


def train(lr):
    global updates
    model.train()
    hidden = model.init_hidden(args.batch_size)
    for i in range(0, train_data.size(0) - 1, args.bptt):
        data, targets = get_batch(train_data, i)
        if optimizer is not None:
            optimizer.zero_grad()
        else:
            model.zero_grad()
        hidden = repackage_hidden(hidden)
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        if optimizer is not None:
            optimizer.step()
        else:
            for prm in model.parameters():
                prm.data.add_(-lr * prm.grad)
        say("step", step=updates, loss=loss.item(), grad_norm=norm.item(),
            lr=optimizer.param_groups[0]["lr"] if optimizer is not None else lr,
            samples=data.size(1), tokens=data.numel(), t=time.perf_counter())
        updates += 1


lr, best = args.lr, None
for _epoch in range(args.epochs):
    train(lr)
    t = time.perf_counter()
    val_loss = evaluate(val_data)
    say("eval", after_step=updates, seconds=time.perf_counter() - t, loss=val_loss)
    if best is None or val_loss < best:
        if args.save:
            t = time.perf_counter()
            with open(args.save, "wb") as f:
                torch.save(model, f)
            say("checkpoint", after_step=updates, seconds=time.perf_counter() - t)
            with open(args.save, "rb") as f:
                loaded = torch.load(f, weights_only=False)
            pairs = zip(loaded.state_dict().values(), model.state_dict().values(), strict=True)
            say("reloaded", same=all(torch.equal(a, b) for a, b in pairs))
        best = val_loss
    else:
        lr /= 4.0
say("done", steps=updates)
