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

Current architectures (each as Hugging Face's modelling code lays the weights out, and as
Megatron-LM's ``num_floating_point_operations`` counts them):

* multi-head latent attention (DeepSeek-V2/V3, ``kv_lora_rank`` > 0): q = h x n*(d+r) or the
  low-rank q_a (h x q_lora) + norm + q_b (q_lora x n*(d+r)); kv_a h x (kv_lora + r), norm,
  kv_b kv_lora x n*(d + v); o n*v x h (d = ``head_dim`` = qk_nope_head_dim, r =
  ``qk_rope_head_dim``, v = ``v_head_dim``);
* mixed layers: the first ``first_k_dense`` layers have a dense MLP of width ``ffn_hidden``,
  the others routed experts of width ``moe_ffn_hidden`` and shared experts of total width
  ``moe_shared_ffn_hidden`` (any width; default shared count x expert width), plus a router
  h x E (and Qwen2-MoE's shared-expert gate h x 1);
* ``qkv_bias`` (Qwen2: biases on q, k, v only), ``linear_bias`` (GPT-2, GPT-NeoX: every
  linear layer), ``qk_norm`` (Qwen3: RMSNorm over q and k heads, 2*head_dim per layer),
  ``norms_per_layer`` (Gemma2: 4);
* ``mtp_layers`` multi-token-prediction modules (DeepSeek-V3): each one transformer layer,
  two norms and an eh projection 2h x h, sharing the embedding and the head;
* vocabulary padding: ``vocab_divisor`` > 1 pads V to a multiple of divisor x TP, as
  Megatron-LM's ``--make-vocab-size-divisible-by`` (default 128) does.

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
    experts of width ``moe_ffn_hidden`` (default ``ffn_hidden``), ``moe_top_k`` active per
    token, plus shared experts (``moe_shared_experts`` of the routed width, or one total
    width ``moe_shared_ffn_hidden``); the first ``first_k_dense`` layers are dense.
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
    moe_ffn_hidden: int | None = None
    moe_shared_ffn_hidden: int | None = None
    moe_shared_gate: bool = False
    first_k_dense: int = 0
    qkv_bias: bool = False
    qk_norm: bool = False
    norms_per_layer: int = 2
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int | None = None
    mtp_layers: int = 0
    vocab_divisor: int = 1
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
        if not 0 <= self.first_k_dense <= self.layers:
            raise ConfigError(f"first_k_dense={self.first_k_dense} must be in 0..layers="
                              f"{self.layers}")
        if self.mla and self.heads is None:
            raise ConfigError("multi-head latent attention needs the head count (--heads)")
        if self.vocab_divisor < 1:
            raise ConfigError(f"vocab_divisor must be >= 1, got {self.vocab_divisor}")

    # -- derived widths -------------------------------------------------------------------
    @property
    def mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3)."""
        return self.kv_lora_rank > 0

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
        """Attention width heads x head_dim (PaLM's H*Q); hidden when neither is given.

        With MLA: heads x (nope + rope) head dims, the query/key width.
        """
        if self.mla:
            return self.n_heads * (self.dim_head + self.qk_rope_head_dim)
        if self.heads is None and self.head_dim is None:
            return self.hidden
        return self.n_heads * self.dim_head

    @property
    def kv_width(self) -> int:
        if self.mla:  # K and V after kv_b, averaged: activations keep both
            return (self.q_width + self.v_width) // 2
        if self.heads is None and self.head_dim is None and self.kv_heads is None:
            return self.hidden
        return self.n_kv_heads * self.dim_head

    @property
    def v_width(self) -> int:
        """Heads x value head dim (the attention output width fed to the o projection)."""
        if self.mla:
            return self.n_heads * (self.v_head_dim or self.dim_head)
        return self.q_width

    @property
    def attn_core_width(self) -> float:
        """(QK^T width + AV width) / 2: PaLM's H*Q for standard attention; MLA differs."""
        return (self.q_width + self.v_width) / 2.0

    @property
    def ffn(self) -> int:
        return self.ffn_hidden if self.ffn_hidden is not None else 4 * self.hidden

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn_hidden if self.moe_ffn_hidden is not None else self.ffn

    @property
    def shared_ffn(self) -> int:
        """Total width of the shared experts of one MoE layer (0 without)."""
        if not self.moe_experts:
            return 0
        if self.moe_shared_ffn_hidden is not None:
            return self.moe_shared_ffn_hidden
        return self.moe_shared_experts * self.expert_ffn

    @property
    def moe_layers(self) -> int:
        return self.layers - self.first_k_dense if self.moe_experts else 0

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    @property
    def mlp_mats(self) -> int:
        return 3 if self.swiglu else 2

    def padded_vocab(self, tp: int = 1) -> int:
        """V padded to a multiple of vocab_divisor x tp (Megatron-LM; V itself when 1)."""
        mult = self.vocab_divisor * tp if self.vocab_divisor > 1 else 1
        return -(-self.vocab // mult) * mult

    def mlp_flop_width(self) -> float:
        """Mean over layers of the MLP width one token passes through (k experts + shared)."""
        moe = self.expert_ffn * self.moe_top_k + self.shared_ffn
        return (self.dense_layers * self.ffn + self.moe_layers * moe) / self.layers

    @property
    def has_shape(self) -> bool:
        """True when the parameter count can be derived from the shape (vocab known)."""
        return self.vocab > 0

    # -- parameter inventory --------------------------------------------------------------
    def attention_matrices(self) -> list[Matrix]:
        """One layer's attention weights (count 1); MLA as DeepSeek-V2/V3 lay them out."""
        h, n = self.hidden, self.n_heads
        if not self.mla:
            q, kv = self.q_width, self.kv_width
            return [Matrix("attn_q", h, q, 1), Matrix("attn_kv", h, kv, 2),
                    Matrix("attn_o", q, h, 1)]
        rope, q = self.qk_rope_head_dim, self.q_width
        out = ([Matrix("attn_q", h, q, 1)] if self.q_lora_rank is None else
               [Matrix("attn_q_a", h, self.q_lora_rank, 1),
                Matrix("attn_q_a_norm", self.q_lora_rank, 1, 1),
                Matrix("attn_q_b", self.q_lora_rank, q, 1)])
        kvl = self.kv_lora_rank
        return out + [Matrix("attn_kv_a", h, kvl + rope, 1), Matrix("attn_kv_a_norm", kvl, 1, 1),
                      Matrix("attn_kv_b", kvl, n * self.dim_head + self.v_width, 1),
                      Matrix("attn_o", self.v_width, h, 1)]

    def layer_matrices(self, moe: bool) -> list[Matrix]:
        """One layer's weights (count per layer), dense or MoE."""
        h, m = self.hidden, self.mlp_mats
        out = self.attention_matrices()
        out.append(Matrix("norm", h, 1, self.norms_per_layer * (2 if self.norm_bias else 1)))
        if self.qk_norm:
            out.append(Matrix("qk_norm", self.dim_head, 1, 2))
        widths: list[int] = [self.ffn] if not moe else []
        if moe:
            e, fe = self.moe_experts, self.expert_ffn
            out.append(Matrix("moe_expert", h, fe, m * e, expert=True))
            out.append(Matrix("moe_router", h, e, 1))
            if self.shared_ffn:
                out.append(Matrix("moe_shared", h, self.shared_ffn, m))
                widths.append(self.shared_ffn)
            if self.moe_shared_gate:
                out.append(Matrix("moe_shared_gate", h, 1, 1))
        else:
            out.append(Matrix("mlp", h, self.ffn, m))
        if self.linear_bias or self.qkv_bias:
            out.append(Matrix("attn_bias", self.q_width + 2 * self.kv_width
                              + (h if self.linear_bias else 0), 1, 1))
        if self.linear_bias:
            for f in widths:
                out.append(Matrix("mlp_bias", f * (m - 1) + h, 1, 1))
            if moe:
                out.append(Matrix("moe_expert_bias", self.expert_ffn * (m - 1) + h, 1,
                                  self.moe_experts, expert=True))
        return out

    def matrices(self, tp: int = 1) -> list[Matrix]:
        """Every weight tensor of the model (see the module docstring for the layout).

        ``tp`` only matters with vocabulary padding (V padded to a multiple of divisor x tp).
        """
        h = self.hidden
        out: list[Matrix] = []
        for moe, count in ((False, self.dense_layers), (True, self.moe_layers)):
            if count:
                out.extend(Matrix(m.name, m.rows, m.cols, m.count * count, m.expert)
                           for m in self.layer_matrices(moe))
        out.append(Matrix("final_norm", h, 1, 2 if self.norm_bias else 1))
        if self.mtp_layers:
            last_moe = self.moe_layers > 0
            out.extend(Matrix("mtp_" + m.name, m.rows, m.cols, m.count * self.mtp_layers,
                              m.expert) for m in self.layer_matrices(last_moe))
            out.append(Matrix("mtp_norms", h, 1, 3 * self.mtp_layers))  # enorm, hnorm, final
            out.append(Matrix("mtp_eh_proj", 2 * h, h, self.mtp_layers))
        vocab = self.padded_vocab(tp)
        out.append(Matrix("tok_emb", vocab, h, 1))
        if not self.tied_embeddings:
            out.append(Matrix("lm_head", vocab, h, 1))
        if self.position_embeddings:
            out.append(Matrix("pos_emb", self.position_embeddings, h, 1))
        return out

    def input_embedding_params(self, tp: int = 1) -> int:
        """Token-embedding table V*h (a lookup: no matmul FLOPs unless tied to the head)."""
        return self.padded_vocab(tp) * self.hidden

    def position_embedding_params(self) -> int:
        return self.position_embeddings * self.hidden

    def layer_params(self, tp: int = 1) -> int:
        """Parameters of all transformer layers plus the final norm (no embeddings, no head)."""
        skip = {"tok_emb", "lm_head", "pos_emb"}
        return sum(m.numel for m in self.matrices(tp) if m.name not in skip)

    def expert_params(self) -> int:
        """Routed-expert parameters (sharded over expert parallelism), MTP included."""
        return sum(m.numel for m in self.matrices() if m.expert)

    def num_params(self, tp: int = 1) -> float:
        """Total parameters (``params`` if given, else counted from the shape)."""
        if self.params is not None:
            return float(self.params)
        self._need_shape("num_params")
        return float(sum(m.numel for m in self.matrices(tp)))

    def num_active_params(self, tp: int = 1) -> float:
        """Parameters used per token: MoE routed experts count top_k/E of their total.

        With ``params`` given the count is taken as already active per token.
        """
        if self.params is not None:
            return float(self.params)
        self._need_shape("num_active_params")
        total = 0.0
        for m in self.matrices(tp):
            share = self.moe_top_k / self.moe_experts if m.expert else 1.0
            total += m.numel * share
        return total

    def _need_shape(self, what: str) -> None:
        if not self.has_shape:
            raise ConfigError(f"{what} needs the vocabulary size or a parameter count; "
                              "give --vocab V (with the shape flags) or --params N")
