"""A Hugging Face ``config.json`` (already parsed) -> :class:`ModelSpec` keyword arguments.

Pure mapping: the caller reads the file. Each family is mapped field by field as its
``transformers`` modelling code builds the weights; the result says which fields were used
and which were ignored (present in the file but not affecting the counts, e.g. rope scaling,
dropout, sliding windows: attention is counted over the full sequence). An unknown
``model_type``, or a family feature the formulas do not model, is a ConfigError naming it.

Families: llama, mistral, qwen2, qwen3 (dense); mixtral, qwen2_moe, qwen3_moe (MoE);
deepseek_v2, deepseek_v3 (MLA + first-k-dense MoE + shared experts); gemma, gemma2; gpt2;
gpt_neox.

Example::

    kwargs, used, ignored = spec_kwargs(json.loads(Path("config.json").read_text()))
    spec = ModelSpec(seq_len=4096, **kwargs)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import ConfigError

__all__ = ["FAMILIES", "spec_kwargs"]

# Keys that never affect a count (metadata, runtime switches).
_META = {"architectures", "model_type", "torch_dtype", "transformers_version", "_name_or_path",
         "auto_map", "bos_token_id", "eos_token_id", "pad_token_id", "use_cache",
         "initializer_range", "quantization_config", "dtype"}

Mapper = Callable[["_Reader"], dict[str, Any]]


class _Reader:
    """Reads fields of one config, remembering which were used."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.used: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.config:
            self.used.add(key)
            value = self.config[key]
            return default if value is None else value
        return default

    def need(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ConfigError(f"config.json of model_type {self.config.get('model_type')!r} "
                              f"lacks {key!r}, which the formulas need")
        return value


def _common(r: _Reader, tied_default: bool) -> dict[str, Any]:
    heads = int(r.need("num_attention_heads"))
    hidden = int(r.need("hidden_size"))
    out: dict[str, Any] = {
        "layers": int(r.need("num_hidden_layers")), "hidden": hidden, "heads": heads,
        "kv_heads": int(r.get("num_key_value_heads", heads)),
        "head_dim": int(r.get("head_dim", hidden // heads)),
        "ffn_hidden": int(r.need("intermediate_size")), "vocab": int(r.need("vocab_size")),
        "swiglu": True, "tied_embeddings": bool(r.get("tie_word_embeddings", tied_default)),
    }
    r.get("max_position_embeddings")  # the default sequence length (see seq_len_default)
    return out


def _biases(r: _Reader, out: dict[str, Any]) -> dict[str, Any]:
    """Llama-style attention_bias (q, k, v, o) and mlp_bias."""
    attn, mlp = bool(r.get("attention_bias", False)), bool(r.get("mlp_bias", False))
    if attn != mlp:
        raise ConfigError("attention_bias without mlp_bias (or the reverse) is not modelled; "
                          "use the shape flags with --params for this model")
    out["linear_bias"] = attn
    return out


def _llama(r: _Reader) -> dict[str, Any]:
    return _biases(r, _common(r, tied_default=False))


def _qwen2(r: _Reader) -> dict[str, Any]:
    out = _common(r, tied_default=False)
    out["qkv_bias"] = True  # Qwen2Attention: q, k, v with bias, o without
    return out


def _qwen3(r: _Reader) -> dict[str, Any]:
    out = _biases(r, _common(r, tied_default=False))
    out["qk_norm"] = True  # Qwen3Attention: RMSNorm over q and k (head_dim each)
    return out


def _moe_layers_prefix(r: _Reader, layers: int) -> int:
    """Dense layers of Qwen-MoE configs: only a leading block of mlp_only_layers."""
    step = int(r.get("decoder_sparse_step", 1))
    only = sorted(int(i) for i in r.get("mlp_only_layers", []))
    if step != 1 or only != list(range(len(only))):
        raise ConfigError(f"decoder_sparse_step={step} / mlp_only_layers={only}: only a "
                          "leading block of dense layers is modelled (first-k-dense)")
    return min(len(only), layers)


def _mixtral(r: _Reader) -> dict[str, Any]:
    out = _common(r, tied_default=False)
    out.update(moe_experts=int(r.need("num_local_experts")),
               moe_top_k=int(r.need("num_experts_per_tok")))
    return out


def _qwen2_moe(r: _Reader) -> dict[str, Any]:
    out = _qwen2(r)
    out.update(moe_experts=int(r.need("num_experts")), moe_top_k=int(r.need("num_experts_per_tok")),
               moe_ffn_hidden=int(r.need("moe_intermediate_size")),
               moe_shared_ffn_hidden=int(r.get("shared_expert_intermediate_size", 0)),
               moe_shared_gate=True, first_k_dense=_moe_layers_prefix(r, out["layers"]))
    return out


def _qwen3_moe(r: _Reader) -> dict[str, Any]:
    out = _qwen3(r)
    out.update(moe_experts=int(r.need("num_experts")), moe_top_k=int(r.need("num_experts_per_tok")),
               moe_ffn_hidden=int(r.need("moe_intermediate_size")),
               first_k_dense=_moe_layers_prefix(r, out["layers"]))
    return out


def _deepseek(r: _Reader) -> dict[str, Any]:
    out = _common(r, tied_default=False)
    out["kv_heads"] = None  # MLA: num_key_value_heads plays no part
    r.used.discard("num_key_value_heads")
    if int(r.get("moe_layer_freq", 1)) != 1:
        raise ConfigError("moe_layer_freq != 1 is not modelled (only first-k-dense)")
    experts = int(r.get("n_routed_experts", 0))
    out.update(head_dim=int(r.need("qk_nope_head_dim")),
               qk_rope_head_dim=int(r.need("qk_rope_head_dim")),
               v_head_dim=int(r.need("v_head_dim")), kv_lora_rank=int(r.need("kv_lora_rank")),
               q_lora_rank=r.get("q_lora_rank"))
    if experts:
        moe_ffn = int(r.need("moe_intermediate_size"))
        out.update(moe_experts=experts, moe_top_k=int(r.need("num_experts_per_tok")),
                   moe_ffn_hidden=moe_ffn,
                   moe_shared_ffn_hidden=int(r.get("n_shared_experts", 0)) * moe_ffn,
                   first_k_dense=int(r.get("first_k_dense_replace", 0)))
    return out


def _gemma(r: _Reader) -> dict[str, Any]:
    out = _common(r, tied_default=True)  # GemmaMLP: gated GeLU, 3 matrices
    out["norms_per_layer"] = 4 if r.config.get("model_type") == "gemma2" else 2
    return out


def _gpt2(r: _Reader) -> dict[str, Any]:
    hidden = int(r.need("n_embd"))
    positions = int(r.need("n_positions"))
    return {"layers": int(r.need("n_layer")), "hidden": hidden, "heads": int(r.need("n_head")),
            "ffn_hidden": int(r.get("n_inner", 4 * hidden)), "vocab": int(r.need("vocab_size")),
            "tied_embeddings": bool(r.get("tie_word_embeddings", True)),
            "position_embeddings": positions, "linear_bias": True, "norm_bias": True}


def _gpt_neox(r: _Reader) -> dict[str, Any]:
    out = _common(r, tied_default=False)
    if not r.get("attention_bias", True):
        raise ConfigError("gpt_neox with attention_bias=false (biases on the MLP only) is not "
                          "modelled; use the shape flags with --params")
    out.update(swiglu=False, kv_heads=None, norm_bias=True, linear_bias=True)
    r.used.discard("num_key_value_heads")
    return out


FAMILIES: dict[str, Mapper] = {
    "llama": _llama, "mistral": _llama, "qwen2": _qwen2, "qwen3": _qwen3,
    "mixtral": _mixtral, "qwen2_moe": _qwen2_moe, "qwen3_moe": _qwen3_moe,
    "deepseek_v2": _deepseek, "deepseek_v3": _deepseek, "gemma": _gemma, "gemma2": _gemma,
    "gpt2": _gpt2, "gpt_neox": _gpt_neox,
}


def seq_len_default(config: dict[str, Any]) -> int | None:
    """The context length the config declares (used when --seq-len is not given)."""
    for key in ("max_position_embeddings", "n_positions", "n_ctx"):
        if isinstance(config.get(key), int):
            return int(config[key])
    return None


def spec_kwargs(config: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    """(ModelSpec keyword arguments without seq_len, fields used, fields ignored)."""
    model_type = config.get("model_type")
    mapper = FAMILIES.get(str(model_type))
    if mapper is None:
        raise ConfigError(f"config.json model_type {model_type!r} is not supported (known: "
                          f"{', '.join(FAMILIES)}); describe the model with the shape flags "
                          "(--layers --hidden --heads --kv-heads --ffn-hidden --vocab ...)")
    reader = _Reader(config)
    kwargs = mapper(reader)
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    ignored = sorted(k for k in config if k not in reader.used and k not in _META)
    return kwargs, sorted(reader.used), ignored
