"""A causal-LM script in the style of transformers' examples/pytorch/language-modeling/
run_clm_no_trainer.py (third-party fixture).

Written for stepscope's third-party suite: ``Accelerator(gradient_accumulation_steps=2)``,
``accelerator.prepare`` of a 2-layer GPT-2 built from a local config (no hub download),
AdamW, a linear schedule and DataLoaders; ``with accelerator.accumulate(model)``,
``accelerator.backward(loss)`` (which divides by the accumulation count), ``optimizer.step()``
/ ``lr_scheduler.step()`` / ``zero_grad()`` on every micro-batch (accelerate skips them
until gradients sync), 18 sequences at batch 4 = 5 micro-batches per epoch (each epoch ends
on a one-micro-batch step), evaluation with perplexity after every epoch.

Its own numbers: ``SS step`` per optimizer step (``accelerator.sync_gradients``): the mean
of the step's micro-batch losses (what a user logging ``outputs.loss`` sees), the global
gradient norm before ``optimizer.step()`` (no clipping; float64), lr, perf_counter; ``SS eval`` with
duration, eval loss and the number of steps done before it; ``SS done``.
"""

import math
import time

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import GPT2Config, GPT2LMHeadModel, default_data_collator, get_scheduler


def say(kind, **kv):
    # the line and its newline in one write: ranks share this stdout, unbuffered under torchrun
    print("SS " + kind + "".join(f" {k}={v!r}" for k, v in kv.items()) + "\n", end="", flush=True)


def blocks(n, offset):
    out = []
    for i in range(n):
        x = torch.randint(0, 128, (32,), generator=torch.Generator().manual_seed(offset + i))
        out.append({"input_ids": x, "labels": x.clone()})
    return out


accelerator = Accelerator(gradient_accumulation_steps=2, cpu=True)
torch.manual_seed(0)
cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=64,
                 bos_token_id=0, eos_token_id=0)
model = GPT2LMHeadModel(cfg)
train_dataloader = DataLoader(blocks(18, 0), shuffle=True, batch_size=4,
                              collate_fn=default_data_collator)
eval_dataloader = DataLoader(blocks(24, 1000), batch_size=4, collate_fn=default_data_collator)
no_decay = ["bias", "layer_norm.weight"]
groups = [
    {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
     "weight_decay": 0.01},
    {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
     "weight_decay": 0.0},
]
optimizer = torch.optim.AdamW(groups, lr=1e-3)
epochs = 2
steps_per_epoch = math.ceil(len(train_dataloader) / 2)
lr_scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=0,
                             num_training_steps=epochs * steps_per_epoch)
model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler)

completed_steps = 0
for _epoch in range(epochs):
    model.train()
    micro = []
    for batch in train_dataloader:
        with accelerator.accumulate(model):
            outputs = model(**batch)
            loss = outputs.loss
            micro.append(loss.detach().float().item())
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                grads = [p.grad.detach().double().flatten() for p in model.parameters()
                         if p.grad is not None]
                norm = torch.linalg.vector_norm(torch.cat(grads)).item()
                lr = optimizer.param_groups[0]["lr"]
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            say("step", step=completed_steps, loss=sum(micro) / len(micro), grad_norm=norm,
                lr=lr, micro=len(micro), t=time.perf_counter())
            completed_steps += 1
            micro = []
    t = time.perf_counter()
    model.eval()
    losses = []
    for batch in eval_dataloader:
        with torch.no_grad():
            outputs = model(**batch)
        losses.append(accelerator.gather_for_metrics(outputs.loss.repeat(4)))
    eval_loss = torch.mean(torch.cat(losses)).item()
    say("eval", after_step=completed_steps, seconds=time.perf_counter() - t, loss=eval_loss,
        perplexity=math.exp(eval_loss))
say("done", steps=completed_steps)
