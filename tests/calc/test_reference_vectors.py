"""Every vector of REFERENCE_VECTORS.md (executed anchors' code) as a test, read in place."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stepscope.calc.flops import flops_per_token
from stepscope.calc.memory import deepspeed_estimate, estimate
from stepscope.calc.model import ModelSpec

FILE = Path(__file__).resolve().parents[2] / "REFERENCE_VECTORS.md"
TEXT = FILE.read_text(encoding="utf-8")
PARTS = re.split(r"\*\*(RV-[A-Z]\d+)\*\*", TEXT)
VECTORS = {PARTS[i]: PARTS[i + 1] for i in range(1, len(PARTS), 2)}

V3 = dict(layers=61, hidden=7168, heads=128, head_dim=128, ffn_hidden=18432, vocab=129280,
          swiglu=True, q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64,
          v_head_dim=128, moe_experts=256, moe_top_k=8, moe_ffn_hidden=2048,
          moe_shared_ffn_hidden=2048, first_k_dense=3, seq_len=4096)
V2_LITE = dict(layers=27, hidden=2048, heads=16, head_dim=128, ffn_hidden=10944, vocab=102400,
               swiglu=True, kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128,
               moe_experts=64, moe_top_k=6, moe_ffn_hidden=1408, moe_shared_experts=2,
               first_k_dense=1, seq_len=4096)
MIXTRAL = ModelSpec(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                    swiglu=True, vocab=32000, moe_experts=8, moe_top_k=2, seq_len=4096)
LLAMA3_8B = dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, swiglu=True,
                 vocab=128256, seq_len=8192)
LLAMA2_7B_PARAMS, EMBEDDING = 6_738_415_616, 131_072_000

# vector -> the value stepscope computes (one number, or a tuple printed in order).
CASES: dict[str, object] = {
    "RV-F01": lambda: flops_per_token(ModelSpec(**V3), "megatron").flops_per_token,
    "RV-F02": lambda: flops_per_token(ModelSpec(**V3, mtp_layers=1), "megatron").flops_per_token,
    "RV-F03": lambda: flops_per_token(ModelSpec(**V2_LITE), "megatron").flops_per_token,
    "RV-F04": lambda: flops_per_token(ModelSpec(
        layers=24, hidden=2048, heads=16, ffn_hidden=5632, vocab=151936, swiglu=True,
        moe_experts=60, moe_top_k=4, moe_ffn_hidden=1408, moe_shared_ffn_hidden=5632,
        seq_len=4096), "megatron").flops_per_token,
    "RV-F05": lambda: flops_per_token(ModelSpec(
        layers=8, hidden=1024, heads=16, kv_heads=4, ffn_hidden=4096, vocab=32768, swiglu=True,
        moe_experts=16, moe_top_k=2, moe_ffn_hidden=512, moe_shared_ffn_hidden=1536,
        first_k_dense=2, seq_len=2048), "megatron").flops_per_token,
    "RV-M01": lambda: _mixtral(ep=1, zero=1),
    "RV-M02": lambda: _mixtral(ep=2, zero=1),
    "RV-M03": lambda: _mixtral(ep=8, zero=1),
    "RV-M04": lambda: _mixtral(ep=8, zero=0),
    "RV-M05": lambda: estimate(ModelSpec(**V2_LITE), dp=8, zero=1, ep=8,
                               convention="megatron").model_states_bytes,
    "RV-D01": lambda: _ds(2, None),
    "RV-D02": lambda: _ds(2, "optimizer"),
    "RV-D03": lambda: _ds(3, None),
    "RV-D04": lambda: _ds(3, "params"),
    "RV-D05": lambda: _ds(3, "optimizer"),
    "RV-T01": lambda: _titan(ModelSpec(**LLAMA3_8B)),
    "RV-T02": lambda: _titan(ModelSpec(**LLAMA3_8B, tied_embeddings=True)),
    "RV-T03": lambda: _titan(ModelSpec(**V2_LITE)),
}


def _mixtral(ep: int, zero: int) -> float:
    return estimate(MIXTRAL, dp=16, pp=4, zero=zero, ep=ep,
                    convention="megatron").model_states_bytes


def _ds(zero: int, offload: str | None) -> tuple[float, float]:
    e = deepspeed_estimate(None, params=LLAMA2_7B_PARAMS, dp=32, zero=zero, gpus_per_node=8,
                           offload=offload, largest_layer_params=EMBEDDING)
    return e.host_bytes, e.model_states_bytes


def _titan(spec: ModelSpec) -> tuple[float, float]:
    # torchtitan's nparams de-duplicates a tied matrix, as num_params() counts it once.
    return spec.num_params(), flops_per_token(spec, "torchtitan").flops_per_token


def _printed(paragraph: str) -> list[float]:
    return [float(n.replace(",", "")) for n in re.findall(r"\*\*([\d,]+)\*\*", paragraph)]


def test_every_vector_is_covered() -> None:
    assert set(VECTORS) == set(CASES)
    assert "d98e8a64ddf34856e74b24714e3bedb2f5a39553" in TEXT  # each anchor's commit named


@pytest.mark.parametrize("vid", sorted(CASES))
def test_vector(vid: str) -> None:
    compute = CASES[vid]
    assert callable(compute)
    got = compute()
    values = list(got) if isinstance(got, tuple) else [got]
    printed = _printed(VECTORS[vid])
    assert printed and printed == values, (vid, printed, values)
