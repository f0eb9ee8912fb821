"""Hand-computable checks of the FLOPs conventions, recompute, MoE and the memory model.

The tiny MoE model used throughout (all numbers below are worked out from it by hand):
L=1, h=4, one head of width 4 (MHA), f=8, 4 routed experts (top-1), V=10, T=8, tied.
    attention 4*4 (q) + 2*4*4 (k, v) + 4*4 (o)     = 64
    norms     (2*1 + 1) * 4                        = 12
    experts   4 experts * 2 matrices * 4*8         = 256   (1 of 4 active: 64)
    router    4*4                                  = 16
    embedding 10*4                                 = 40
    total 388, active 196
"""

from __future__ import annotations

import pytest

from stepscope.calc.activations import stage_activations
from stepscope.calc.flops import ModelSpec, flops_per_token, hfu, mfu, tokens_per_s_from_step
from stepscope.calc.memory import estimate, estimate_memory, model_states
from stepscope.errors import ConfigError

MOE = ModelSpec(layers=1, hidden=4, heads=1, ffn_hidden=8, moe_experts=4, moe_top_k=1,
                vocab=10, seq_len=8, tied_embeddings=True)


def test_moe_param_counts() -> None:
    assert MOE.num_params() == 388
    assert MOE.num_active_params() == 196


def test_conventions_on_moe() -> None:
    # palm: 6*196 + 12*L*H*Q*T = 1176 + 12*1*4*8 = 1560
    assert flops_per_token(MOE).flops_per_token == 1560
    # 6n: no attention term
    assert flops_per_token(MOE, "6n").flops_per_token == 1176
    # torchtitan, tied: the shared matrix is the output projection and stays counted
    assert flops_per_token(MOE, "torchtitan").flops_per_token == 1560
    # megatron-2022: 6*(2*4*4 + 2*4*4 + 2*4*8*top1) + 12*T*H*Q + 6*h*V = 768 + 384 + 240
    assert flops_per_token(MOE, "megatron-2022").flops_per_token == 1392
    # megatron: attention halved for the causal mask: 768 + 192 + 240
    assert flops_per_token(MOE, "megatron").flops_per_token == 1200
    # an explicit causal flag overrides the convention's default
    assert flops_per_token(MOE, "palm", causal=True).flops_per_token == 1176 + 192
    assert flops_per_token(MOE, "megatron", causal=False).flops_per_token == 1392


def test_recompute_hardware_flops() -> None:
    def hw(convention: str, recompute: str) -> float:
        return flops_per_token(MOE, convention, recompute).hardware_flops_per_token

    assert hw("palm", "none") == 1560
    assert hw("palm", "selective") == 1560 + 384 / 3          # attention forward (PaLM App. B)
    assert hw("palm", "full") == 1560 * 4 / 3                 # one more forward of everything
    assert hw("megatron-2022", "selective") == 1392 + 384     # Korthikanti's count
    assert hw("megatron-2022", "full") == 1392 + 768 / 3 + 384 / 3  # layers only, not logits
    est = flops_per_token(MOE, "palm", "full", recompute_fraction=0.5)
    assert est.recompute_flops_per_token == 0.5 * 1176 / 3 + 384 / 3
    assert est.dense_flops_per_token + est.attention_flops_per_token == est.flops_per_token


def test_mfu_hfu_and_tokens() -> None:
    assert mfu(1000, 1e9, 1e12, 2) == 0.5
    assert hfu(1000, 4e9 / 3, 1e12, 2) == pytest.approx(2 / 3)
    assert tokens_per_s_from_step(2.0, 1024, micro_batch=4, grad_accum=8, dp=16) == 262144
    with pytest.raises(ConfigError, match="devices must be positive"):
        mfu(1000, 1e9, 1e12, 0)
    with pytest.raises(ConfigError, match="global batch"):
        tokens_per_s_from_step(1.0, 1024)


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"convention": "kaplan"}, "unknown FLOPs convention"),
    ({"recompute": "half"}, "unknown recompute"),
    ({"recompute_fraction": 1.5}, "recompute_fraction"),
])
def test_flops_argument_errors(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        flops_per_token(MOE, **kwargs)  # type: ignore[arg-type]


def test_shape_errors() -> None:
    no_vocab = ModelSpec(layers=2, hidden=64, seq_len=128, params=1e6)
    with pytest.raises(ConfigError, match="--vocab"):
        flops_per_token(no_vocab, "megatron")
    with pytest.raises(ConfigError, match="--vocab"):
        flops_per_token(no_vocab, "torchtitan")
    assert flops_per_token(no_vocab).flops_per_token == 6e6 + 12 * 2 * 64 * 128
    with pytest.raises(ConfigError, match="kv_heads=3 must divide heads=8"):
        ModelSpec(layers=1, hidden=64, heads=8, kv_heads=3, seq_len=8)
    with pytest.raises(ConfigError, match="seq_len must be a positive"):
        ModelSpec(layers=1, hidden=64, seq_len=0)


# --- memory -------------------------------------------------------------------------------

def test_model_states_precisions_and_optimizers() -> None:
    def per_param(**kw: object) -> tuple[float, ...]:
        return model_states(1.0, **kw)[:4]  # type: ignore[arg-type]

    assert per_param() == (2, 2, 12, 0)                       # ZeRO mixed Adam
    assert per_param(precision="bf16") == (2, 2, 4, 0)        # pure bf16, bf16 moments
    assert per_param(precision="fp32") == (4, 4, 8, 0)
    assert per_param(optimizer="sgd") == (2, 2, 8, 0)         # master + momentum
    assert per_param(optimizer="adafactor", adafactor_state_params=0.25) == (2, 2, 5, 0)
    assert per_param(dp=4, zero=3, offload="optimizer") == (0.5, 0.5, 0, 3)
    assert per_param(dp=4, zero=3, offload="params") == (0, 0.5, 0, 3.5)


def test_estimate_memory_keyword_form() -> None:
    assert estimate_memory(num_params=7e9, dp=8, zero_stage=3).model_states_bytes == 14e9


def test_adafactor_counts_factored_statistics() -> None:
    tiny = ModelSpec(layers=1, hidden=4, heads=1, vocab=10, seq_len=8, tied_embeddings=True)
    # matrices: q 4x4, k/v 2 x 4x4, o 4x4, mlp 2 x 4x16, emb 10x4; norms 3 vectors of 4
    stats = (4 + 4) * 4 + (4 + 16) * 2 + (10 + 4) + 3 * 4
    est = estimate(tiny, optimizer="adafactor")
    assert est.optimizer_bytes == 4 * tiny.num_params() + 4 * stats


def test_last_stage_dominates_with_large_vocab() -> None:
    spec = ModelSpec(layers=2, hidden=8, heads=2, vocab=1000, seq_len=4)
    a = stage_activations(spec, micro_batch=1, pp=2)
    # layer: s*b*h*(34 + 5*a*s/h) = 32*39; first stage: 1 layer x 2 in flight + (8sb + sbh)*2
    assert a.layer_bytes == 1248
    # last stage: 1 layer x 1 in flight + output 4sbh + 4sbV = 128 + 16000
    assert (a.stage, a.total_bytes) == ("last", 1248 + 16128)
    first = stage_activations(ModelSpec(layers=2, hidden=8, heads=2, vocab=1, seq_len=4),
                              pp=2)
    assert (first.stage, first.total_bytes) == ("first", 2 * 1248 + 2 * (32 + 32))


def test_in_flight_and_interleaving() -> None:
    spec = ModelSpec(layers=8, hidden=8, heads=2, vocab=1, seq_len=4)
    full = stage_activations(spec, pp=4)
    few = stage_activations(spec, pp=4, num_microbatches=2)   # only 2 micro-batches in flight
    assert (full.in_flight, few.in_flight) == (4, 2)
    inter = stage_activations(spec, pp=4, virtual_stages=2)
    assert inter.total_bytes == pytest.approx(full.total_bytes * (1 + 3 / 8))


def test_flash_attention_and_sequence_parallel() -> None:
    spec = ModelSpec(layers=1, hidden=8, heads=2, vocab=1, seq_len=4)
    plain = stage_activations(spec).layer_bytes
    flash = stage_activations(spec, flash_attention=True).layer_bytes
    assert plain - flash == 5 * 2 * 4 * 4 - 4 * 2 * 4   # 5as^2b out, fp32 stats 4asb in
    tp = stage_activations(spec, tp=2).layer_bytes
    sp = stage_activations(spec, tp=2, sequence_parallel=True).layer_bytes
    assert (tp, sp) == (32 * (10 + 12 + 5 * 2 * 4 / 16), 32 * (34 + 5) / 2)


def test_estimate_shards_weights_by_stage() -> None:
    spec = ModelSpec(layers=4, hidden=8, heads=2, vocab=100, seq_len=4)
    # untied, pp=1: layers + final norm + embedding + head, / tp
    assert estimate(spec, tp=2).params_per_device == spec.num_params() / 2
    # pp=2: half the layers + one embedding-sized matrix (first: embedding; last: head)
    assert estimate(spec, pp=2).params_per_device == spec.layer_params() / 2 + 800
    with pytest.raises(ConfigError, match="give a model"):
        estimate(None)


def test_score_activations_need_heads() -> None:
    no_heads = ModelSpec(layers=2, hidden=8, vocab=10, seq_len=4)
    with pytest.raises(ConfigError, match="--heads"):
        estimate(no_heads)
    # no s^2 term to size with selective recompute: 34*s*b*h per layer + embedding + output
    est = estimate(no_heads, recompute="selective")
    assert est.activations_bytes == 2 * 34 * 32 + (8 * 4 + 32) + (4 * 32 + 4 * 4 * 10)
