"""A Hugging Face ``Trainer`` fine-tuning script in the style of transformers' examples
(run_clm.py; third-party fixture).

Written for stepscope's third-party suite: a 2-layer GPT-2 built from a local config (no
hub download), 36 training sequences at batch 4 with gradient accumulation 2 (9 micro-
batches per epoch: each epoch ends on a one-micro-batch step), 2 epochs, evaluation at
every epoch's end, ``max_grad_norm`` 1.0, ``logging_steps=1`` (``--logging-steps``).

Its own numbers come from the Trainer: ``SS step`` per optimizer step from ``log_history``
(loss, grad_norm — the Trainer's pre-clip value — and learning_rate) with the
perf_counter at ``on_step_end``; ``SS eval`` per evaluation (the Trainer's
``eval_runtime`` and ``eval_loss``, with the number of steps done before it); ``SS done``.
"""

import argparse
import time

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

p = argparse.ArgumentParser()
p.add_argument("--out", default="hf-out")
p.add_argument("--callback", default="", help="run dir for stepscope's StepscopeCallback")
p.add_argument("--logging-steps", type=int, default=1)
args = p.parse_args()


def say(kind, **kv):
    # the line and its newline in one write: ranks share this stdout, unbuffered under torchrun
    print("SS " + kind + "".join(f" {k}={v!r}" for k, v in kv.items()) + "\n", end="", flush=True)


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, offset=0):
        self.n, self.offset = n, offset

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.offset + i)
        x = torch.randint(0, 128, (32,), generator=g)
        return {"input_ids": x, "labels": x.clone()}


class Clock(TrainerCallback):
    """The script's own timestamps: after each optimizer step, around each evaluation."""

    def __init__(self):
        self.step_t = []

    def on_step_end(self, args, state, control, **kw):
        self.step_t.append(time.perf_counter())

    def on_evaluate(self, args, state, control, metrics=None, **kw):
        say("eval", after_step=state.global_step, seconds=metrics["eval_runtime"],
            loss=metrics["eval_loss"])


torch.manual_seed(0)
cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=64,
                 bos_token_id=0, eos_token_id=0)
targs = TrainingArguments(output_dir=args.out, per_device_train_batch_size=4,
                          per_device_eval_batch_size=4, gradient_accumulation_steps=2,
                          num_train_epochs=2, logging_steps=args.logging_steps,
                          eval_strategy="epoch",
                          report_to=[], save_strategy="no", use_cpu=True,
                          learning_rate=1e-3, seed=3, disable_tqdm=True,
                          dataloader_num_workers=0)
clock = Clock()
callbacks = [clock]
if args.callback:
    from stepscope.integrations.hf import StepscopeCallback

    callbacks.append(StepscopeCallback(args.callback))
trainer = Trainer(model=GPT2LMHeadModel(cfg), args=targs, train_dataset=Tokens(36),
                  eval_dataset=Tokens(32, offset=1000), callbacks=callbacks)
trainer.train()
logs = [h for h in trainer.state.log_history if "loss" in h and "grad_norm" in h]
for i, (h, t) in enumerate(zip(logs, clock.step_t, strict=args.logging_steps == 1)):
    say("step", step=i, loss=h["loss"], grad_norm=h["grad_norm"], lr=h["learning_rate"], t=t)
say("done", steps=trainer.state.global_step)
