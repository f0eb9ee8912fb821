"""A plain PyTorch loop whose end its own code decides (reliability fixture).

Run plain it exits 0 in every mode; under ``stepscope run`` it must too.

``--mode dataloader``: a DataLoader with two forked workers, left while the workers are
busy: its shutdown ends them with SIGTERM (torch's ``w.terminate()``), then training goes
on (torch's workers set a SIGTERM handler of their own in C). ``--mode fork``: an
``os.fork`` helper, ended with SIGTERM; ``--mode mp-process``: a forked
``multiprocessing.Process`` helper (a prefetcher, a logger) ended by ``terminate()``.
``--mode late-handler``: after its first step the script installs a SIGTERM handler that
writes a checkpoint (a second of work), prints ``CHECKPOINT SAVED`` and exits 0; it
prints ``READY`` and waits for the signal. ``--mode hangup``: prints ``READY`` after
step 2 and trains ``--steps`` steps (a SIGHUP meanwhile, ignored by ``nohup``, must not
end it). ``--mode detach``: starts a helper in a session of its own (an upload), prints
``DETACHED <pid>``, exits. Every mode prints ``PID <pid>`` first and ``TRAINED <n>`` at
the end (the optimizer steps taken, the first one before anything else).
"""

import argparse
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import torch
import torch.utils.data._utils as data_utils
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--mode", required=True,
               choices=["dataloader", "fork", "mp-process", "late-handler", "hangup", "detach"])
p.add_argument("--steps", type=int, default=12)
p.add_argument("--checkpoint", default="")
args = p.parse_args()
print(f"PID {os.getpid()}", flush=True)

model = nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def step(x: torch.Tensor) -> None:
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()


class Slow(torch.utils.data.Dataset):
    """The first 8 samples at once; later ones keep a worker busy past the shutdown."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        if i >= 8:
            time.sleep(60)
        return torch.randn(8)


def on_term(signum, frame):
    with open(args.checkpoint, "wb") as f:
        for _ in range(10):  # a checkpoint written in pieces: cut off if the process dies
            f.write(b"x" * 1024)
            f.flush()
            time.sleep(0.1)
    print("CHECKPOINT SAVED", flush=True)
    sys.exit(0)


step(torch.randn(4, 8))  # stepscope sets up its recording (and SIGTERM finaliser) here
done = 1
if args.mode == "dataloader":
    # torch joins a busy worker for MP_STATUS_CHECK_INTERVAL (5 s) before terminate():
    # shortened so the test is quick; the path taken is torch's own.
    data_utils.MP_STATUS_CHECK_INTERVAL = 0.5
    loader = torch.utils.data.DataLoader(Slow(), batch_size=4, num_workers=2,
                                         multiprocessing_context="fork")
    it = iter(loader)
    for _ in range(2):  # samples 0-7; the workers are now inside samples 8 and up
        step(next(it))
        done += 1
    del it  # shutdown: the workers are busy, so torch ends them with SIGTERM
    print("WORKERS ENDED", flush=True)
elif args.mode == "fork":
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    step(torch.randn(4, 8))
    done += 1
    os.kill(pid, signal.SIGTERM)
    _, status = os.waitpid(pid, 0)
    print(f"HELPER ENDED {-os.WTERMSIG(status)}", flush=True)
elif args.mode == "mp-process":
    proc = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
    proc.start()
    step(torch.randn(4, 8))
    done += 1
    proc.terminate()
    proc.join()
    print(f"HELPER ENDED {proc.exitcode}", flush=True)  # -15: it died of the SIGTERM
elif args.mode == "detach":
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              start_new_session=True)
    print(f"DETACHED {helper.pid}", flush=True)
for i in range(args.steps):
    step(torch.randn(4, 8))
    done += 1
    if args.mode == "late-handler" and i == 0:
        signal.signal(signal.SIGTERM, on_term)
    if args.mode in ("late-handler", "hangup") and i == 2:
        print("READY", flush=True)
    if args.mode == "late-handler" and i >= 2:
        time.sleep(0.2)  # waiting for the signal; the handler ends the script
    if args.mode == "hangup":
        time.sleep(0.05)
print(f"TRAINED {done}", flush=True)
