"""Hugging Face Trainer, unmodified (test fixture for `stepscope run`): a 2-layer GPT-2
built in code, gradient accumulation 2, on the CPU. Prints the Trainer's own per-step
logs as ``LOG <loss> <grad_norm> <learning_rate>`` lines."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        x = torch.randint(0, 128, (32,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": x, "labels": x.clone()}


torch.manual_seed(0)
cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=64,
                 bos_token_id=0, eos_token_id=0)
args = TrainingArguments(output_dir="hf-out", per_device_train_batch_size=4,
                         gradient_accumulation_steps=2, max_steps=4, logging_steps=1,
                         report_to=[], save_strategy="no", use_cpu=True, learning_rate=1e-3,
                         seed=3, disable_tqdm=True)
trainer = Trainer(model=GPT2LMHeadModel(cfg), args=args, train_dataset=Tokens())
trainer.train()
for h in trainer.state.log_history:
    if "loss" in h:
        print(f"LOG {h['loss']!r} {h['grad_norm']!r} {h['learning_rate']!r}", flush=True)
