"""The pre-clip norm is seen both ways a loop clips (real torch on CPU): through
clip_grad_norm_, and through get_total_norm + clip_grads_with_norm_ as accelerate 1.16
(and so transformers' Trainer) clips; each clip once; the originals come back."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from stepscope.integrations.torch.clipnorm import watch_clip_norms  # noqa: E402


def _params() -> list[Any]:
    torch.manual_seed(0)
    p = [torch.nn.Parameter(torch.randn(5, 3)) for _ in range(2)]
    for x in p:
        x.grad = torch.randn_like(x) * 10
    return p


def test_both_ways_to_clip_report_the_pre_clip_norm_once() -> None:
    utils = torch.nn.utils
    before = (utils.clip_grad_norm_, utils.clip_grads_with_norm_)
    seen: list[float] = []
    undo = watch_clip_norms(lambda n: seen.append(float(n)))
    try:
        p = _params()
        want = float(torch.linalg.vector_norm(torch.cat([x.grad.flatten() for x in p])))
        got = torch.nn.utils.clip_grad_norm_(p, 1.0)
        assert seen == [pytest.approx(want)] and float(got) == pytest.approx(want)
        q = _params()  # accelerate 1.16's way: the caller's own total norm, then the clip
        total = torch.nn.utils.get_total_norm([x.grad for x in q])
        torch.nn.utils.clip_grads_with_norm_(q, 1.0, total_norm=total)
        assert seen[1:] == [pytest.approx(want)]
        after = float(torch.linalg.vector_norm(torch.cat([x.grad.flatten() for x in q])))
        assert after == pytest.approx(1.0, rel=1e-4)  # it still clipped
    finally:
        undo()
    assert (utils.clip_grad_norm_, utils.clip_grads_with_norm_) == before
    assert torch.nn.utils.clip_grad.clip_grad_norm_ is before[0]
