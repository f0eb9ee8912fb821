"""A closure-optimizer script in the style of pytorch/examples time_sequence_prediction
(third-party fixture).

Written for stepscope's third-party suite: two ``LSTMCell`` layers predicting sine waves
(float64 inputs, no token ids), ``optim.LBFGS`` whose ``step(closure)`` evaluates the
closure (zero_grad, forward, loss, backward) up to ``--max-iter`` times per step, and a
prediction of the future under ``torch.no_grad()`` after every step.

Its own numbers: ``SS step`` per ``optimizer.step`` (the loss it returns = the closure's
first evaluation, the gradient norm of that first evaluation, closure calls, lr,
perf_counter), ``SS eval`` for each no-grad prediction, ``SS done``.
"""

import argparse
import math
import time

import torch
from torch import nn, optim

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=5)
p.add_argument("--max-iter", type=int, default=4)
args = p.parse_args()
H = 8


def say(kind, **kv):
    # the line and its newline in one write: ranks share this stdout, unbuffered under torchrun
    print("SS " + kind + "".join(f" {k}={v!r}" for k, v in kv.items()) + "\n", end="", flush=True)


class Sequence(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, H)
        self.lstm2 = nn.LSTMCell(H, H)
        self.linear = nn.Linear(H, 1)

    def forward(self, inp, future=0):
        outputs = []
        h_t, c_t, h_t2, c_t2 = (torch.zeros(inp.size(0), H, dtype=torch.double)
                                for _ in range(4))
        for input_t in inp.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs.append(output)
        for _ in range(future):
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs.append(output)
        return torch.cat(outputs, dim=1)


torch.manual_seed(0)
x = torch.arange(21, dtype=torch.double) + torch.randint(-20, 20, (11, 1)).double()
data = torch.sin(x / 4.0)
inp, target = data[3:, :-1], data[3:, 1:]
test_input, test_target = data[:3, :-1], data[:3, 1:]
seq = Sequence().double()
criterion = nn.MSELoss()
optimizer = optim.LBFGS(seq.parameters(), lr=0.8, max_iter=args.max_iter)
calls = []
for i in range(args.steps):
    calls.clear()

    def closure():
        optimizer.zero_grad()
        loss = criterion(seq(inp), target)
        loss.backward()
        if not calls:
            calls.append(math.sqrt(sum(float((q.grad ** 2).sum()) for q in seq.parameters())))
        else:
            calls.append(None)
        return loss

    loss = optimizer.step(closure)
    say("step", step=i, loss=loss.item(), grad_norm=calls[0], closure_calls=len(calls),
        lr=optimizer.param_groups[0]["lr"], t=time.perf_counter())
    t = time.perf_counter()
    with torch.no_grad():
        future = 100
        pred = seq(test_input, future=future)
        test_loss = criterion(pred[:, :-future], test_target).item()
    say("eval", after_step=i + 1, seconds=time.perf_counter() - t, loss=test_loss)
say("done", steps=args.steps)
