"""A plain PyTorch image-classifier loop (test fixture for `stepscope run`; knows nothing of
stepscope): a small CNN (or, with --mlp, an MLP) on random images, DataLoader + SGD.

Its inputs are images, not token ids: the run's MFU needs FLOPs counted from the network.
Prints ``FLOPS <forward FLOPs of one batch>`` measured by FlopCounterMode on a real forward
(the reference), then one ``STEP <i>`` line per step.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.flop_counter import FlopCounterMode

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=10)
p.add_argument("--batch", type=int, default=16)
p.add_argument("--mlp", action="store_true")
args = p.parse_args()

torch.manual_seed(0)
if args.mlp:
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 256), nn.ReLU(),
                          nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
else:
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1, groups=2),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                          nn.Linear(32 * 4 * 4, 10))
images = torch.randn(args.steps * args.batch, 3, 16, 16)
labels = torch.randint(0, 10, (args.steps * args.batch,))
loader = DataLoader(TensorDataset(images, labels), batch_size=args.batch, shuffle=False)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
with FlopCounterMode(display=False) as counter, torch.no_grad():
    model(images[:args.batch])
print(f"FLOPS {counter.get_total_flops()}", flush=True)

for step, (x, y) in enumerate(loader):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    print(f"STEP {step} loss={loss.item():.6f}", flush=True)
