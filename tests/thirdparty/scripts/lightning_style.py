"""A Lightning training script in the style of Lightning's examples (third-party fixture).

Written for stepscope's third-party suite: a ``LightningModule`` next-token model whose
``training_step`` returns the loss (automatic optimization: Lightning calls
``optimizer.step(closure)`` and runs forward and backward inside the closure),
``gradient_clip_val=0.25``, a validation loop every epoch logging ``val_loss`` (plus
Lightning's sanity check before training), 3 epochs of 6 batches.

Its own numbers, from a callback of the script: ``SS step`` per optimizer step (loss from
``on_train_batch_end``, the global gradient norm at ``on_before_optimizer_step`` — before
Lightning clips — in float64, lr, perf_counter), ``SS eval`` per validation run (duration,
``val_loss``, steps done before it), ``SS done``.
"""

import time

import lightning.pytorch as pl
import torch

VOCAB, SEQ = 64, 16


def say(kind, **kv):
    # the line and its newline in one write: ranks share this stdout, unbuffered under torchrun
    print("SS " + kind + "".join(f" {k}={v!r}" for k, v in kv.items()) + "\n", end="", flush=True)


class TinyLM(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 64), torch.nn.Linear(64, 64),
                                       torch.nn.GELU(), torch.nn.Linear(64, VOCAB))

    def _loss(self, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x).reshape(-1, VOCAB), y.reshape(-1))

    def training_step(self, batch, batch_idx):
        return self._loss(batch)

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self._loss(batch))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5, momentum=0.9)


class OwnNumbers(pl.Callback):
    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        grads = [p.grad.detach().double().flatten() for p in pl_module.parameters()
                 if p.grad is not None]
        self.norm = torch.linalg.vector_norm(torch.cat(grads)).item()
        self.lr = optimizer.param_groups[0]["lr"]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        say("step", step=trainer.global_step - 1, loss=outputs["loss"].item(),
            grad_norm=self.norm, lr=self.lr, t=time.perf_counter())

    def on_validation_start(self, trainer, pl_module):
        self.t_val = time.perf_counter()

    def on_validation_end(self, trainer, pl_module):
        val = trainer.callback_metrics.get("val_loss")
        say("eval", after_step=trainer.global_step, seconds=time.perf_counter() - self.t_val,
            loss=float(val) if val is not None else None, sanity=trainer.sanity_checking)


def loader(n, seed):
    data = torch.randint(0, VOCAB, (n, SEQ + 1), generator=torch.Generator().manual_seed(seed))
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(data[:, :-1], data[:, 1:]), batch_size=8)


if __name__ == "__main__":
    pl.seed_everything(5, verbose=False)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=3, gradient_clip_val=0.25,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[OwnNumbers()])
    trainer.fit(TinyLM(), loader(48, 1), loader(200, 2))
    say("done", steps=trainer.global_step)
