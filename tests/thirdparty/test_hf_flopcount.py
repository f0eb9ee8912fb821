"""Counted FLOPs of a Hugging Face model called with an ``attention_mask`` (as
run_clm_no_trainer.py's batches are): transformers 5's mask code reads the mask's values,
which meta tensors cannot give, so the forward is counted once more without it; the FLOPs
are the same as for a call without a mask, and the convention says so. (Before,
the count failed: "Tensor.item() cannot be called on meta tensors")."""

from __future__ import annotations

import pytest
import torch

from stepscope.integrations.torch import flopcount

transformers = pytest.importorskip("transformers")


def _gpt2() -> torch.nn.Module:
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=64,
                                  vocab_size=64, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


def test_a_mask_read_by_value_is_left_out_of_the_count_not_the_flops() -> None:
    model = _gpt2()
    ids = torch.randint(0, 64, (4, 16))
    plain, how = flopcount.forward_flops(*flopcount.capture_call(
        model, (), {"input_ids": ids, "labels": ids}))
    assert plain and not how.endswith(flopcount.MASK_SUFFIX), how
    masked, how = flopcount.forward_flops(*flopcount.capture_call(
        model, (), {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}))
    assert masked == plain and how.endswith(flopcount.MASK_SUFFIX), (masked, plain, how)
    fields = flopcount.counted_fields(masked, 4, 64, masked=True)
    assert fields["flops_convention"].endswith(
        "no recompute; attention_mask left out: the model reads its values; FLOPs do not)")
    assert fields["flops_per_token"] == 3 * plain / 64


def test_a_failure_without_a_mask_stays_not_counted() -> None:
    class ReadsValues(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * float(x.sum())

    fwd, why = flopcount.forward_flops(ReadsValues(), (torch.ones(2, 4),), {})
    assert fwd is None and why.startswith("not counted (RuntimeError"), why
