"""Cross-check of the FLOPs formulas against torch's FlopCounterMode on the CPU.

On the CPU, ``F.scaled_dot_product_attention`` dispatches to
``aten._scaled_dot_product_flash_attention_for_cpu`` (and its ``_backward``), which
FlopCounterMode counts as 0 FLOPs: the attention term would be missing from the measurement.
The formulas below are registered for those two ops (``custom_mapping``), derived here:

    forward   QK^T: 2*b*h*s_q*s_k*d   +  P V: 2*b*h*s_q*s_k*d_v
    backward  dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q: twice the forward

counted without causal halving, as torch counts its GPU attention kernels and as the PaLM
formula's 12*L*H*Q*T does. Then measured FLOPs of one forward+backward must equal the explicit
matmul count exactly and the PaLM convention (6N + 12LHQT) within 2%.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
nn = torch.nn

from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from stepscope.calc.flops import ModelSpec, flops_per_token, forward_flops_breakdown  # noqa: E402


def _sdpa_cpu_forward(q: Any, k: Any, v: Any, *args: Any, **kwargs: Any) -> int:
    b, h, s_q, d = q
    s_k, d_v = k[-2], v[-1]
    return 2 * b * h * s_q * s_k * d + 2 * b * h * s_q * s_k * d_v


def _sdpa_cpu_backward(grad_out: Any, q: Any, k: Any, v: Any, *args: Any, **kwargs: Any) -> int:
    return 2 * _sdpa_cpu_forward(q, k, v)


CPU_SDPA_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu_forward,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_cpu_backward,
}


class _Block(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, ffn: int, swiglu: bool) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.n1, self.n2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.q = nn.Linear(d, d, bias=False)
        self.kv = nn.Linear(d, 2 * kv_heads * self.hd, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.swiglu = swiglu
        self.up = nn.Linear(d, (2 if swiglu else 1) * ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)

    def forward(self, x: Any) -> Any:
        b, t, d = x.shape
        y = self.n1(x)
        q = self.q(y).view(b, t, self.heads, self.hd).transpose(1, 2)
        k, v = (z.view(b, t, self.kv_heads, self.hd).transpose(1, 2)
                for z in self.kv(y).chunk(2, dim=-1))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                             enable_gqa=self.kv_heads != self.heads)
        x = x + self.o(att.transpose(1, 2).reshape(b, t, d))
        u = self.up(self.n2(x))
        if self.swiglu:
            gate, up = u.chunk(2, dim=-1)
            u = F.silu(gate) * up
        else:
            u = F.gelu(u)
        return x + self.down(u)


class _TinyDecoder(nn.Module):
    """A small causal decoder built for this test: RoPE-free, tied head, no biases."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.tok = nn.Embedding(spec.vocab, spec.hidden)
        self.blocks = nn.ModuleList(
            _Block(spec.hidden, spec.n_heads, spec.n_kv_heads, spec.ffn, spec.swiglu)
            for _ in range(spec.layers))
        self.norm = nn.RMSNorm(spec.hidden)
        self.head = nn.Linear(spec.hidden, spec.vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx: Any) -> Any:
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def _measure(model: Any, batch: int, seq_len: int, vocab: int) -> int:
    idx = torch.randint(0, vocab, (batch, seq_len))
    with FlopCounterMode(display=False, custom_mapping=CPU_SDPA_FLOPS) as counter:
        logits = model(idx)
        F.cross_entropy(logits.flatten(0, 1), idx.flatten()).backward()
    return int(counter.get_total_flops())


@pytest.mark.parametrize("spec", [
    ModelSpec(layers=2, hidden=64, heads=4, vocab=256, seq_len=128, tied_embeddings=True),
    ModelSpec(layers=2, hidden=64, heads=4, kv_heads=2, ffn_hidden=96, swiglu=True, vocab=256,
              seq_len=128, tied_embeddings=True),
], ids=["mha-gelu", "gqa-swiglu"])
def test_flopcounter_matches_formulas(spec: ModelSpec) -> None:
    torch.manual_seed(0)
    model = _TinyDecoder(spec)
    assert sum(p.numel() for p in model.parameters()) == spec.num_params()
    batch = 2
    measured = _measure(model, batch, spec.seq_len, spec.vocab)
    # Exact: every matmul forward, x3 with backward (the attention term included).
    assert measured == forward_flops_breakdown(spec, batch)["forward_backward"]
    palm = flops_per_token(spec)
    per_token = measured / (batch * spec.seq_len)
    assert per_token == pytest.approx(palm.flops_per_token, rel=0.02)
    # Without the registered formulas the attention term is lost: the counter reads low by
    # about the attention share, which is why the mapping is needed.
    with FlopCounterMode(display=False) as bare:
        model(torch.randint(0, spec.vocab, (batch, spec.seq_len))).sum().backward()
    assert bare.get_total_flops() == pytest.approx(
        measured - palm.attention_flops_per_token * batch * spec.seq_len, rel=1e-9)


@pytest.mark.skipif(importlib.util.find_spec("stepscope.demo.torch_gpt") is None,
                    reason="stepscope.demo.torch_gpt not in this build")
def test_flopcounter_on_demo_model() -> None:
    from stepscope.demo.torch_gpt import GPT, GPTConfig

    cfg = GPTConfig(n_layer=2, n_head=4, d_model=64, seq_len=64)
    torch.manual_seed(0)
    model = GPT(cfg)
    spec = ModelSpec(layers=cfg.n_layer, hidden=cfg.d_model, heads=cfg.n_head,
                     vocab=cfg.vocab_size, seq_len=cfg.seq_len, tied_embeddings=True,
                     position_embeddings=cfg.seq_len, linear_bias=True, norm_bias=True)
    assert sum(p.numel() for p in model.parameters()) == spec.num_params()
    measured = _measure(model, 2, cfg.seq_len, cfg.vocab_size)
    assert measured == forward_flops_breakdown(spec, 2)["forward_backward"]
    palm = flops_per_token(spec).flops_per_token  # counts biases and norms as 6 FLOPs each
    assert measured / (2 * cfg.seq_len) == pytest.approx(palm, rel=0.02)
