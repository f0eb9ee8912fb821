"""Lightning training, unmodified (test fixture for `stepscope run`): tiny next-token
model, accumulate_grad_batches=2, 4 optimizer steps on the CPU. Prints each micro-batch's
loss as ``MICRO <loss>``."""

import lightning.pytorch as pl
import torch

VOCAB, SEQ = 64, 16


class TinyLM(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 32), torch.nn.Linear(32, VOCAB))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x).reshape(-1, VOCAB), y.reshape(-1))
        print(f"MICRO {loss.item()!r}", flush=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


pl.seed_everything(5, verbose=False)
data = torch.randint(0, VOCAB, (64, SEQ + 1))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data[:, :-1], data[:, 1:]),
                                     batch_size=4)
trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=4, accumulate_grad_batches=2,
                     logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False)
trainer.fit(TinyLM(), loader)
