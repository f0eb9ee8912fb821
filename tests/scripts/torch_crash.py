"""Training loop that crashes in step 5 (test fixture): records before it must survive."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(3)
data = torch.randint(0, 32, (64, 9))
loader = DataLoader(TensorDataset(data), batch_size=4)
model = nn.Sequential(nn.Embedding(32, 16), nn.Linear(16, 32))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step, (batch,) in enumerate(loader):
    if step == 5:
        raise ValueError("corrupt shard 17")
    loss = nn.functional.cross_entropy(model(batch[:, :-1]).reshape(-1, 32),
                                       batch[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"STEP {step}", flush=True)
