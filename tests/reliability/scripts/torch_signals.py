"""A plain PyTorch loop that stops cleanly on a signal (reliability fixture).

Prints ``PID <pid>`` at start and ``READY`` after three optimizer steps. ``--handle term``
installs a SIGTERM handler that ends the loop after the current step, prints ``STOPPED
CLEANLY`` and exits with ``--exit-code``; ``--handle int`` does the same on SIGINT
(KeyboardInterrupt); ``--handle ignore`` ignores SIGTERM; ``--handle none`` keeps the
default (killed by the signal); ``--child`` also starts a helper process that just sleeps
(it must not outlive the run).
"""

import argparse
import os
import signal
import subprocess
import sys
import time

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--handle", choices=["term", "int", "none", "ignore"], default="term")
p.add_argument("--exit-code", type=int, default=3)
p.add_argument("--max-steps", type=int, default=3000)
p.add_argument("--child", action="store_true")
args = p.parse_args()

stop = False


def _stop(signum, frame):
    global stop
    stop = True


if args.handle == "term":
    signal.signal(signal.SIGTERM, _stop)
elif args.handle == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
helper = None
if args.child:
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(f"HELPER {helper.pid}", flush=True)
print(f"PID {os.getpid()}", flush=True)
model = nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
try:
    for step in range(args.max_steps):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step == 2:
            print("READY", flush=True)
        if stop:
            break
        time.sleep(0.01)
except KeyboardInterrupt:
    if args.handle != "int":
        raise
print("STOPPED CLEANLY", flush=True)
sys.exit(args.exit_code)
