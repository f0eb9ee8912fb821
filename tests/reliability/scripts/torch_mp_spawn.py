"""DDP started with ``torch.multiprocessing.spawn`` (reliability fixture).

No ``RANK`` variable reaches the workers: each learns its rank from its spawn index and
``init_process_group``. Each of ``--world`` ranks does ``--steps`` optimizer steps.
"""

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker(rank: int, world: int, steps: int, port: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = DDP(nn.Linear(16, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        x = torch.randn(8, 16)
        loss = (model(x) - x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--steps", type=int, default=12)
    args = p.parse_args()
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        os.environ.pop(var, None)
    mp.spawn(worker, args=(args.world, args.steps, _free_port()), nprocs=args.world)
