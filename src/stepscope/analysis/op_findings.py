"""Findings from a trace's op ranking: one op family taking a large share of op time.

The field report's profile had dropout (``aten::bernoulli_``) at 27.6% of op time, and the
diagnosis said nothing. Each op of ``top_ops`` (``stepscope trace --json``: aggregated by
name over ranks and steps) is put in a family by its name; a family at or above
``OP_SHARE_WARN_PCT`` of op time is a finding naming the ops and what to try.

Example::

    op_findings({"top_ops": [{"name": "aten::bernoulli_", "share_pct": 27.6, ...}]})
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..findings import Finding

__all__ = ["op_findings", "op_family", "OP_SHARE_WARN_PCT", "OP_FAMILIES"]

# One family over a fifth of all op time is worth a look (stepscope's choice: below that,
# a transformer's matmuls, norms and activations share the time with no single culprit).
OP_SHARE_WARN_PCT = 20.0
# Family: (name pattern, what to try). First match wins; the patterns are lower-case.
OP_FAMILIES: dict[str, tuple[str, str]] = {
    "dropout": (r"bernoulli|dropout|fused_dropout",
                "Dropout's random masks cost this much at this size: use a fused dropout "
                "(scaled_dot_product_attention's dropout_p), or drop dropout for "
                "pre-training"),
    "matmul": (r"\bmm\b|matmul|addmm|bmm|gemm|linear|cutlass|sm\d+_xmma|ampere_|hopper_",
               "The run is matmul-bound, which is where the time should go: MFU measures "
               "how well; bf16/tf32 and larger matmuls raise it"),
    "attention": (r"attention|flash|sdpa|softmax",
                  "Use a fused attention kernel (scaled_dot_product_attention / flash "
                  "attention) and check the mask is not materialised"),
    "copy": (r"copy_|memcpy|contiguous|\bto\b|_to_copy|cast",
             "Tensor copies and casts: look for .contiguous(), .to(dtype) and host-device "
             "transfers inside the step"),
    "elementwise": (r"add|mul|gelu|relu|silu|tanh|layer_norm|native_layer_norm|div|sub",
                    "Many small element-wise kernels: fuse them (torch.compile)"),
    "optimizer": (r"adam|sgd|foreach|_fused_adam",
                  "Use the fused or foreach optimizer implementation (fused=True)"),
}


_WASTE = ("dropout", "copy")


def op_family(name: str) -> str:
    """The family of an op name (``"other"`` when no pattern matches)."""
    low = name.lower()
    return next((fam for fam, (pat, _) in OP_FAMILIES.items() if re.search(pat, low)),
                "other")


def op_findings(report: Mapping[str, Any]) -> list[Finding]:
    """A finding per op family at or above ``OP_SHARE_WARN_PCT`` of op time."""
    fams: dict[str, list[Mapping[str, Any]]] = {}
    for op in report.get("top_ops") or []:
        if isinstance(op, Mapping) and isinstance(op.get("share_pct"), (int, float)):
            fams.setdefault(op_family(str(op.get("name", ""))), []).append(op)
    out = []
    for fam, ops in fams.items():
        share = float(sum(o["share_pct"] for o in ops))
        if share < OP_SHARE_WARN_PCT:
            continue
        ops = sorted(ops, key=lambda o: -o["share_pct"])
        names = ", ".join(f"{o['name']} {o['share_pct']:.1f}%" for o in ops[:3])
        advice = OP_FAMILIES[fam][1] if fam in OP_FAMILIES else (
            "Look at this op's callers in the trace (stepscope trace --top)")
        out.append(Finding(
            # waste (random masks, copies) is a warning; where compute should go is info
            category="compute", severity="warning" if fam in _WASTE else "info",
            message=f"trace: {fam} ops take {share:.1f}% of op time ({names})",
            evidence={"family": fam, "share_pct": share, "impact_frac": 0.0,
                      "ops": [str(o.get("name")) for o in ops]},
            confidence=0.8, rule="trace.ops", recommendation=advice))
    return out
