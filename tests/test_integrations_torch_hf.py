"""Hugging Face Trainer with StepscopeCallback: a 2-layer GPT-2 built in code, on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from stepscope.integrations.hf import StepscopeCallback  # noqa: E402
from stepscope.store import RunDir  # noqa: E402


class _Tokens(torch.utils.data.Dataset):  # type: ignore[misc]
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict:
        x = torch.randint(0, 128, (32,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": x, "labels": x.clone()}


@pytest.mark.xdist_group("hf")
def test_trainer_callback_rows_match_trainer_logs(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=64,
                     bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg)
    args = TrainingArguments(
        output_dir=str(tmp_path / "hf-out"), per_device_train_batch_size=4,
        gradient_accumulation_steps=2, max_steps=4, logging_steps=1, report_to=[],
        save_strategy="no", use_cpu=True, learning_rate=1e-3, seed=3, disable_tqdm=True,
        dataloader_num_workers=0)
    run_dir = tmp_path / "run"
    trainer = Trainer(model=model, args=args, train_dataset=_Tokens(),
                      callbacks=[StepscopeCallback(run_dir, name="gpt2-tiny")])
    trainer.train()

    table, stats = RunDir(run_dir).read_steps()
    assert stats.skipped == 0
    assert table["step"].tolist() == [0, 1, 2, 3]
    assert table["tokens"].tolist() == [2 * 4 * 32.0] * 4  # 2 micro-batches of 4 x 32
    assert table["samples"].tolist() == [8.0] * 4
    for col in ("step_time_s", "data_wait_s", "forward_s", "backward_s", "optimizer_s",
                "mem_peak_bytes"):
        assert np.isfinite(table[col]).all() and (table[col] >= 0).all(), col
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 4
    assert np.allclose(table["loss"], [h["loss"] for h in logs], rtol=1e-4)
    assert np.allclose(table["grad_norm"], [h["grad_norm"] for h in logs], rtol=1e-4)
    assert np.allclose(table["lr"], [h["learning_rate"] for h in logs])
    meta = RunDir(run_dir).read_meta()
    assert meta.status == "finished" and meta.name == "gpt2-tiny"
    b = meta.baseline
    assert b["num_params"] == model.num_parameters()
    assert b["model_name"] == "GPT2LMHeadModel"
    assert (b["grad_accum"], b["micro_batch"], b["global_batch"]) == (2, 4, 8)
    assert b["seed"] == 3 and b["vocab_size"] == 128 and b["optimizer"] == "AdamW"
    assert meta.environment["flops_per_token"] == 6 * b["num_params"]
    assert meta.config["grad_norm_source"] == "Trainer logs"
