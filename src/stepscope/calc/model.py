"""The model description every calculator reads: :class:`ModelSpec` and its parameter counts.

A decoder-only transformer is described by its shape (layers, hidden width, heads, head dim,
KV heads for GQA/MQA, FFN width, SwiGLU, vocabulary, tied embeddings, MoE experts) or, when
only the size is known, by a parameter count (``params``) plus the few shape numbers the
attention and activation terms need (layers, hidden, sequence length).

Parameter counts follow the layout of GPT-2/nanoGPT and Llama (checked against both in the
tests: nanoGPT GPT-2-124M = 124,337,664; Llama-3-8B = 8,030,261,248)::

    per layer   attention  h*q + 2*h*kv + q*h        (q = heads*head_dim, kv = kv_heads*head_dim)
                MLP        (3 if SwiGLU else 2)*h*f  (per expert; MoE adds a router h*E)
                norms      2*h (+2*h with norm biases)
                biases     q + 2*kv + h + f*(2 if SwiGLU else 1) + h   (only with linear_bias)
    once        token embedding V*h, LM head V*h (unless tied), final norm h (+h),
                learned position table P*h (GPT-2; 0 with RoPE/ALiBi)

Example::

    spec = ModelSpec(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                     swiglu=True, vocab=128256, seq_len=8192)
    spec.num_params()   # 8030261248
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError

__all__ = ["ModelSpec", "Matrix"]


@dataclass(frozen=True)
class Matrix:
    """One weight tensor shape, repeated ``count`` times in the model (cols=1 for vectors)."""

    name: str
    rows: int
    cols: int
    count: int
    expert: bool = False  # an MoE routed-expert weight (only top_k of E are active per token)

    @property
    def numel(self) -> int:
        return self.rows * self.cols * self.count


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only transformer, or its parameter count plus the attention shape.

    ``heads``/``head_dim`` default so that heads x head_dim = hidden (attention width =
    hidden); ``kv_heads`` defaults to ``heads`` (multi-head attention); ``ffn_hidden`` to
    4*hidden. ``params``, when given, overrides the count derived from the shape (the
    attention term still uses layers, hidden/heads and seq_len). MoE: ``moe_experts`` routed
    experts of width ``ffn_hidden``, ``moe_top_k`` active per token, plus
    ``moe_shared_experts`` always-active experts.
    """

    layers: int
    hidden: int
    seq_len: int
    heads: int | None = None
    head_dim: int | None = None
    kv_heads: int | None = None
    ffn_hidden: int | None = None
    swiglu: bool = False
    vocab: int = 0
    tied_embeddings: bool = False
    moe_experts: int = 0
    moe_top_k: int = 1
    moe_shared_experts: int = 0
    position_embeddings: int = 0
    linear_bias: bool = False
    norm_bias: bool = False
    params: float | None = None
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for key in ("layers", "hidden", "seq_len"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"model {key} must be a positive integer, got "
                                  f"{getattr(self, key)}; give --{key.replace('_', '-')}")
        if self.heads is not None and self.kv_heads is not None and self.heads % self.kv_heads:
            raise ConfigError(f"kv_heads={self.kv_heads} must divide heads={self.heads} "
                              "(grouped-query attention shares each KV head by a group)")
        if self.moe_experts and not 1 <= self.moe_top_k <= self.moe_experts:
            raise ConfigError(f"moe_top_k={self.moe_top_k} must be in 1..moe_experts="
                              f"{self.moe_experts}")
        if self.params is not None and self.params <= 0:
            raise ConfigError(f"params must be positive, got {self.params}")

    # -- derived widths -------------------------------------------------------------------
    @property
    def n_heads(self) -> int:
        """Query heads; without --heads, hidden // head_dim, else 1 (only widths matter)."""
        if self.heads is not None:
            return self.heads
        if self.head_dim is not None:
            return max(1, self.hidden // self.head_dim)
        return 1

    @property
    def dim_head(self) -> int:
        if self.head_dim is not None:
            return self.head_dim
        return self.hidden // self.n_heads

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.n_heads

    @property
    def q_width(self) -> int:
        """Attention width heads x head_dim (PaLM's H*Q); hidden when neither is given."""
        if self.heads is None and self.head_dim is None:
            return self.hidden
        return self.n_heads * self.dim_head

    @property
    def kv_width(self) -> int:
        if self.heads is None and self.head_dim is None and self.kv_heads is None:
            return self.hidden
        return self.n_kv_heads * self.dim_head

    @property
    def ffn(self) -> int:
        return self.ffn_hidden if self.ffn_hidden is not None else 4 * self.hidden

    @property
    def has_shape(self) -> bool:
        """True when the parameter count can be derived from the shape (vocab known)."""
        return self.vocab > 0

    # -- parameter inventory --------------------------------------------------------------
    def matrices(self) -> list[Matrix]:
        """Every weight tensor of the model (see the module docstring for the layout)."""
        h, q, kv, f, n_layers = self.hidden, self.q_width, self.kv_width, self.ffn, self.layers
        mlp_mats = 3 if self.swiglu else 2
        out: list[Matrix] = [
            Matrix("attn_q", h, q, n_layers), Matrix("attn_kv", h, kv, 2 * n_layers),
            Matrix("attn_o", q, h, n_layers),
            Matrix("norm", h, 1, (2 * n_layers + 1) * (2 if self.norm_bias else 1)),
        ]
        dense_mlps = self.moe_shared_experts if self.moe_experts else 1
        if dense_mlps:
            out.append(Matrix("mlp", h, f, mlp_mats * n_layers * dense_mlps))
        if self.moe_experts:
            out.append(Matrix("moe_expert", h, f, mlp_mats * n_layers * self.moe_experts,
                              expert=True))
            out.append(Matrix("moe_router", h, self.moe_experts, n_layers))
        if self.linear_bias:
            experts = (self.moe_experts + self.moe_shared_experts) if self.moe_experts else 1
            out.append(Matrix("attn_bias", q + 2 * kv + h, 1, n_layers))
            out.append(Matrix("mlp_bias", f * (mlp_mats - 1) + h, 1, n_layers * experts))
        out.append(Matrix("tok_emb", self.vocab, h, 1))
        if not self.tied_embeddings:
            out.append(Matrix("lm_head", self.vocab, h, 1))
        if self.position_embeddings:
            out.append(Matrix("pos_emb", self.position_embeddings, h, 1))
        return out

    def input_embedding_params(self) -> int:
        """Token-embedding table V*h (a lookup: no matmul FLOPs unless tied to the head)."""
        return self.vocab * self.hidden

    def position_embedding_params(self) -> int:
        return self.position_embeddings * self.hidden

    def layer_params(self) -> int:
        """Parameters of all transformer layers plus the final norm (no embeddings, no head)."""
        skip = {"tok_emb", "lm_head", "pos_emb"}
        return sum(m.numel for m in self.matrices() if m.name not in skip)

    def num_params(self) -> float:
        """Total parameters (``params`` if given, else counted from the shape)."""
        if self.params is not None:
            return float(self.params)
        self._need_shape("num_params")
        return float(sum(m.numel for m in self.matrices()))

    def num_active_params(self) -> float:
        """Parameters used per token: MoE routed experts count top_k/E of their total.

        With ``params`` given the count is taken as already active per token.
        """
        if self.params is not None:
            return float(self.params)
        self._need_shape("num_active_params")
        total = 0.0
        for m in self.matrices():
            share = self.moe_top_k / self.moe_experts if m.expert else 1.0
            total += m.numel * share
        return total

    def _need_shape(self, what: str) -> None:
        if not self.has_shape:
            raise ConfigError(f"{what} needs the vocabulary size or a parameter count; "
                              "give --vocab V (with the shape flags) or --params N")
