"""FLOPs of a MindSpore network counted from its cells: any network (CNN, MLP, attention).

``forward_flops(network, *inputs)`` runs the network forward once (PyNative, gradients
off; a GRAPH-mode context is switched to PyNative for that call and back) with forward
hooks on the cells whose work it counts, and adds their analytic FLOPs from the shapes the
hooks saw. Formulas (multiply-add = 2 FLOPs, biases and element-wise work not counted: the
convention of ``torch.utils.flop_counter.FlopCounterMode``, so a network and its torch
twin count alike):

    nn.Dense               2 x rows x in x out          rows: every leading dimension
    nn.Conv1d/2d/3d        2 x N x C_out x prod(out spatial) x (C_in / groups) x prod(kernel)
    nn.MultiheadAttention  2 x B x (L x E x E + 2 x S x E x E)   q, k, v projections
                           + 2 x 2 x B x L x S x E                 QK^T and AV
                           + 2 x B x L x E x E                     output projection

The run's convention is ``counted``: forward FLOPs x 3 (backward = 2 x forward), the same
as the torch path's (``integrations/torch/flopcount.py``).

Example::

    count = forward_flops(net, images)            # FlopCount(total=..., by_cell={...})
    meta = {"environment": flops_fields(count, samples=images.shape[0])}
    rec = LoopRecorder("runs/cnn", network=net, optimizer=opt, meta=meta)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FlopCount", "forward_flops", "count_call", "flops_fields", "dense_flops",
           "conv_flops", "attention_flops"]


def dense_flops(rows: int, cin: int, cout: int) -> int:
    return 2 * rows * cin * cout


def conv_flops(batch: int, cout: int, out_spatial: tuple[int, ...], cin_per_group: int,
               kernel: tuple[int, ...]) -> int:
    return 2 * batch * cout * math.prod(out_spatial) * cin_per_group * math.prod(kernel)


def attention_flops(batch: int, tgt_len: int, src_len: int, embed: int) -> int:
    proj = 2 * batch * (tgt_len * embed * embed + 2 * src_len * embed * embed)
    core = 2 * 2 * batch * tgt_len * src_len * embed
    return proj + core + 2 * batch * tgt_len * embed * embed


@dataclass
class FlopCount:
    """Forward FLOPs of one call: in all, per counted cell (by its name in the network)
    and per cell type."""

    total: int = 0
    by_cell: dict[str, int] = field(default_factory=dict)
    by_type: dict[str, int] = field(default_factory=dict)


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in getattr(x, "shape", ()))


def _as_tuple(v: Any, n: int) -> tuple[int, ...]:
    return tuple(int(k) for k in v) if isinstance(v, (tuple, list)) else (int(v),) * n


def _cell_flops(cell: Any, inputs: tuple[Any, ...], output: Any) -> int | None:
    kind = type(cell).__name__
    if kind == "Dense":
        shape = _shape(inputs[0])
        return dense_flops(math.prod(shape[:-1]), int(cell.in_channels),
                           int(cell.out_channels))
    if kind in ("Conv1d", "Conv2d", "Conv3d"):
        out = _shape(output)
        spatial = out[2:]
        kernel = _as_tuple(cell.kernel_size, len(spatial))
        return conv_flops(out[0], out[1], spatial,
                          int(cell.in_channels) // int(cell.group), kernel)
    if kind == "MultiheadAttention":
        q, k = _shape(inputs[0]), _shape(inputs[1])
        bf = bool(getattr(cell, "batch_first", False))
        b, tgt, src = (q[0], q[1], k[1]) if bf else (q[1], q[0], k[0])
        return attention_flops(b, tgt, src, int(cell.embed_dim))
    return None


_COUNTED = ("Dense", "Conv1d", "Conv2d", "Conv3d", "MultiheadAttention")


def forward_flops(network: Any, *inputs: Any) -> FlopCount:
    """Count one forward of ``network`` on ``inputs`` (see the module doc)."""
    return count_call(network, [network], inputs)


def count_call(call: Any, roots: list[Any], inputs: tuple[Any, ...]) -> FlopCount:
    """Count one ``call(*inputs)`` (a network, or a loss function calling networks) with
    the counted cells of ``roots`` hooked. Every cell of ``roots`` runs in inference mode
    for the call (no BatchNorm statistics move, no dropout draws) and gets its own mode
    back after it."""
    import mindspore as ms

    count = FlopCount()
    handles = []
    mode = ms.get_context("mode")

    def hook(name: str) -> Any:
        def note(cell: Any, args: Any, output: Any) -> None:
            n = _cell_flops(cell, tuple(args), output)
            if n is not None:
                kind = type(cell).__name__
                count.by_cell[name] = count.by_cell.get(name, 0) + n
                count.by_type[kind] = count.by_type.get(kind, 0) + n
        return note

    seen: set[int] = set()
    every: list[Any] = []  # each cell once, with its training flag and phase
    for i, root in enumerate(roots):
        prefix = "" if len(roots) == 1 else f"{i}."
        cells = [(prefix + n if n else prefix.rstrip(".") or n, c)
                 for n, c in root.cells_and_names() if id(c) not in seen]
        seen.update(id(c) for _, c in cells)
        every.extend(c for _, c in cells)
        counted = [(n, c) for n, c in cells if type(c).__name__ in _COUNTED]
        outer = {n for n, _ in counted}  # a counted cell inside another counted one: skip
        for name, cell in counted:
            if any(name != o and name.startswith(o + ".") for o in outer if o):
                continue
            handles.append(cell.register_forward_hook(hook(name)))
    modes = [(c, bool(getattr(c, "training", False)), getattr(c, "_phase", None))
             for c in every]
    try:
        for c in every:
            c.add_flags(training=False)
        if mode != ms.PYNATIVE_MODE:
            ms.set_context(mode=ms.PYNATIVE_MODE)
        with ms._no_grad():
            call(*inputs)
    finally:
        for h in handles:
            h.remove()
        for c, training, phase in modes:
            c.add_flags(training=training)
            if phase is not None:
                c._phase = phase
        if mode != ms.PYNATIVE_MODE:
            ms.set_context(mode=mode)
    count.total = sum(count.by_cell.values())
    return count


def flops_fields(count: FlopCount, samples: int, tokens: int | None = None
                 ) -> dict[str, Any]:
    """run.json ``environment`` FLOPs fields of the ``counted`` convention for one call of
    ``samples`` samples (and ``tokens`` token ids, for a language model)."""
    step = 3.0 * count.total
    out: dict[str, Any] = {"counted_forward_flops": count.total,
                           "flops_per_sample": step / samples,
                           "hardware_flops_per_sample": step / samples}
    if tokens:
        out["flops_per_token"] = out["hardware_flops_per_token"] = step / tokens
    cells = ", ".join(f"nn.{k}" for k in sorted(count.by_type)) or "none"
    out["flops_convention"] = (
        f"counted: forward FLOPs x 3 ({count.total:,} forward FLOPs per call of {samples} "
        f"samples, analytic per cell ({cells}); backward taken as 2x forward; "
        "no recompute)")
    return out
