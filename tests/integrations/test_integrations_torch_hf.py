"""Hugging Face Trainer with StepscopeCallback: a 2-layer GPT-2 built in code, on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from stepscope.integrations.hf import StepscopeCallback  # noqa: E402
from stepscope.rundir.store import RunDir  # noqa: E402


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
    # 6 x matmul parameters: the tied wte is the LM head's matmul, wpe (64 x 64) a lookup
    assert b["embedding_lookup_params"] == 64 * 64
    assert meta.environment["flops_per_token"] == 6 * (b["num_params"] - 64 * 64)
    assert meta.config["grad_norm_source"] == "clip_grad_norm_ (pre-clip)"  # every step


@pytest.mark.xdist_group("hf")
def test_unmodified_trainer_under_stepscope_run(tmp_path):
    from support.torch_run import python_script, stepscope_run

    out = tmp_path / "auto"
    proc = subprocess_in(tmp_path, lambda: stepscope_run(
        out, *python_script("torch_hf_trainer.py")))
    assert proc.returncode == 0, proc.stderr[-2000:]
    logs = [tuple(map(float, line.split()[1:])) for line in proc.stdout.splitlines()
            if line.startswith("LOG ")]
    assert len(logs) == 4
    table, _ = RunDir(out).read_steps()
    assert table["step"].tolist() == [0, 1, 2, 3]
    # model(**batch) keywords are read: 2 micro-batches of 4 x 32 tokens, even on step 0
    # where accelerate's loader has prefetched a third batch
    assert table["tokens"].tolist() == [256.0] * 4
    assert table["micro_batches"].tolist() == [2.0] * 4
    loss, norm, lr = (np.array(c) for c in zip(*logs, strict=True))
    assert np.allclose(table["loss"], loss, rtol=1e-5)
    assert np.allclose(table["grad_norm"], norm, rtol=1e-4)  # from clip_grad_norm_
    assert np.allclose(table["lr"], lr)
    meta = RunDir(out).read_meta()
    assert meta.baseline["grad_accum"] == 2 and meta.baseline["seed"] == 3
    assert meta.config["instrumentation"] == "auto"


def subprocess_in(cwd, fn):
    """Run ``fn`` with ``cwd`` as the working directory (the Trainer writes hf-out/)."""
    import os

    old = os.getcwd()
    os.chdir(cwd)
    try:
        return fn()
    finally:
        os.chdir(old)


class _Probe(transformers.TrainerCallback):  # type: ignore[misc]
    """Pickles and copies the model on every step (EMA copies, whole-model saves), counts
    torch's global forward hooks, and can make train() raise after ``fail_at`` steps."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.hooks_seen: list[int] = []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        import copy
        import io

        torch.save(model, io.BytesIO())
        copy.deepcopy(model)
        self.hooks_seen.append(len(torch.nn.modules.module._global_forward_pre_hooks))
        if self.fail_at is not None and state.global_step == self.fail_at:
            raise RuntimeError("stop here")


@pytest.mark.xdist_group("hf")
def test_two_train_calls_one_run_hooks_once_and_removed(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=128, n_positions=64,
                     bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg)
    args = TrainingArguments(
        output_dir=str(tmp_path / "hf-out"), per_device_train_batch_size=4,
        per_device_eval_batch_size=4, gradient_accumulation_steps=2, max_steps=3,
        logging_steps=1, eval_strategy="steps", eval_steps=3, report_to=[],
        save_strategy="no", use_cpu=True, learning_rate=1e-3, seed=3, disable_tqdm=True,
        dataloader_num_workers=0)
    run_dir = tmp_path / "run"
    cb = StepscopeCallback(run_dir)
    hooks_before = len(torch.nn.modules.module._global_forward_pre_hooks)
    clip_before = torch.nn.utils.clip_grad_norm_
    failing, probe = _Probe(fail_at=2), _Probe()
    # first train() raises after its second step: on_train_end never runs
    with pytest.raises(RuntimeError, match="stop here"):
        Trainer(model=model, args=args, train_dataset=_Tokens(), eval_dataset=_Tokens(),
                callbacks=[cb, failing]).train()
    trainer = Trainer(model=model, args=args, train_dataset=_Tokens(),
                      eval_dataset=_Tokens(), callbacks=[cb, probe])
    trainer.train()
    evaluated = trainer.evaluate()

    assert failing.hooks_seen == probe.hooks_seen[:2] == [hooks_before + 1] * 2
    assert len(torch.nn.modules.module._global_forward_pre_hooks) == hooks_before
    assert torch.nn.utils.clip_grad_norm_ is clip_before
    table, _ = RunDir(run_dir).read_steps()
    assert table["step"].tolist() == [0, 1, 2, 3, 4]  # 2 of the failed train(), then 3
    assert table["tokens"].tolist() == [2 * 4 * 32.0] * 5  # each forward counted once
    logs = [h for h in trainer.state.log_history if "loss" in h and "grad_norm" in h]
    assert np.allclose(table["loss"][2:], [h["loss"] for h in logs], rtol=1e-5)
    # evaluations at the run's steps: after the 3rd step of the second train(), and after
    evals = [(e["step"], e["metrics"]) for e in RunDir(run_dir).read_events("eval")[0]]
    in_train = [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h]
    assert evals == [(5, {"eval_loss": in_train[0]}),
                     (5, {"eval_loss": evaluated["eval_loss"]})]
    assert RunDir(run_dir).read_meta().status == "finished"


@pytest.mark.xdist_group("hf")
def test_evaluation_between_steps_is_eval_time_not_data_wait(tmp_path):
    """An evaluation in the middle of training (eval_steps=2) is the next step's eval_s:
    the Trainer's own eval_runtime, taken out of that step's data wait and span (eval
    time is not data wait)."""
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=128, n_positions=64,
                     bos_token_id=0, eos_token_id=0)
    args = TrainingArguments(
        output_dir=str(tmp_path / "hf-out"), per_device_train_batch_size=4,
        per_device_eval_batch_size=4, max_steps=4, logging_steps=1, eval_strategy="steps",
        eval_steps=2, report_to=[], save_strategy="no", use_cpu=True, learning_rate=1e-3,
        seed=3, disable_tqdm=True, dataloader_num_workers=0)
    run_dir = tmp_path / "run"
    trainer = Trainer(model=GPT2LMHeadModel(cfg), args=args, train_dataset=_Tokens(),
                      eval_dataset=_Tokens(), callbacks=[StepscopeCallback(run_dir)])
    trainer.train()

    table, _ = RunDir(run_dir).read_steps()
    assert table["step"].tolist() == [0, 1, 2, 3]
    [runtime] = [h["eval_runtime"] for h in trainer.state.log_history
                 if "eval_runtime" in h and h["step"] == 2]
    eval_s, wait = table["eval_s"], table["data_wait_s"]
    assert eval_s[2] == pytest.approx(runtime, rel=1e-9)  # 16 eval batches, not a fetch
    assert wait[2] < runtime, (wait.tolist(), runtime)
    assert np.nan_to_num(eval_s[[0, 1, 3]]).tolist() == [0.0, 0.0, 0.0]
    gap = table["end_s"][2] - table["end_s"][1]
    assert table["step_time_s"][2] < gap - 0.9 * runtime  # not in the step's span either
