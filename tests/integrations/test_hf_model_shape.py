"""A transformers model under `stepscope run` is described by the same family mapper as
`--hf-config`: its recorded shape and FLOPs per token equal what the calculator
gives for the model's own config.json. Tiny models are built locally (no hub)."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from stepscope.calc.flops import flops_per_token  # noqa: E402
from stepscope.calc.flopsrun import by_convention  # noqa: E402
from stepscope.calc.hf_config import spec_kwargs  # noqa: E402
from stepscope.calc.model import ModelSpec  # noqa: E402
from stepscope.integrations.torch.layout import (  # noqa: E402
    lookup_only_params,
    transformer_shape,
)

SEQ = 64


def _llama() -> object:
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=SEQ)
    return transformers.LlamaForCausalLM(cfg)


def _mixtral() -> object:
    cfg = transformers.MixtralConfig(vocab_size=128, hidden_size=64, intermediate_size=96,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2, max_position_embeddings=SEQ)
    return transformers.MixtralForCausalLM(cfg)


@pytest.mark.parametrize("build", [_llama, _mixtral], ids=["llama", "mixtral"])
def test_run_reads_a_transformers_model_as_hf_config_does(build: object) -> None:
    model = build()  # type: ignore[operator]
    kwargs, _, _ = spec_kwargs(model.config.to_dict())
    shape = transformer_shape(model)
    assert shape is not None
    for key in ("layers", "heads", "hidden", "vocab", "kv_heads", "ffn_hidden"):
        assert shape[key] == kwargs[key], key
    if kwargs.get("moe_experts"):
        assert (shape["moe_experts"], shape["moe_top_k"]) == (kwargs["moe_experts"],
                                                             kwargs["moe_top_k"])
    n = sum(p.numel() for p in model.parameters())
    table = by_convention(n, lookup_only_params(model), SEQ, shape)
    want = flopsrun_reference(kwargs)
    assert table["megatron"]["flops_per_token"] == want


def flopsrun_reference(kwargs: dict[str, object]) -> float:
    """The calculator's Megatron FLOPs per token for the config (as `mfu --hf-config`)."""
    spec = ModelSpec(seq_len=SEQ, **{k: v for k, v in kwargs.items()
                                     if k not in ("tied_embeddings", "linear_bias")})
    return flops_per_token(spec, "megatron").flops_per_token
