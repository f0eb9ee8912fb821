"""``stepscope memory``: training memory per device (wiring; math in ``calc.memory``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from ..calc.flops import RECOMPUTE
from ..calc.memory import GRAD_DTYPES, MEMORY_CONVENTIONS, MemoryEstimate
from . import cli
from .calc_options import COUNT, NUMBER, model_options, resolve_spec
from .common import emit_json

__all__ = ["memory_cmd", "layout_options", "state_options", "PRECISION_HELP",
           "attention_is_flash"]

F = TypeVar("F", bound=Callable[..., Any])

PRECISION_HELP = (
    "bf16-mixed: bf16 weights and grads + fp32 master weights + fp32 Adam moments "
    "(16 B/param; what 'mixed precision' means in Megatron, DeepSpeed, torch.amp; fp16 alike). "
    "bf16-pure: everything bf16, no fp32 master copy (2+2+2 per moment). fp32: 4 bytes "
    "everywhere. Old names: mixed = bf16-mixed, bf16 = bf16-pure.")


def layout_options(func: F) -> F:
    options = [
        click.option("--dp", type=COUNT, default=1, show_default=True,
                     help="Data parallel size (world = DP x CP x TP x PP)."),
        click.option("--tp", type=COUNT, default=1, show_default=True),
        click.option("--pp", type=COUNT, default=1, show_default=True),
        click.option("--ep", type=COUNT, default=1, show_default=True,
                     help="Expert parallel size: routed experts sharded over it, their "
                     "optimizer over the expert-data-parallel group (Megatron)."),
        click.option("--etp", type=COUNT, default=None,
                     help="Expert tensor parallel size (default: --tp, as Megatron)."),
        click.option("--cp", type=COUNT, default=1, show_default=True,
                     help="Context parallel size: the sequence (and activations) split over it."),
        click.option("--zero", type=click.IntRange(0, 3), default=0, show_default=True),
        click.option("--micro-batch", type=COUNT, default=1, show_default=True),
        click.option("--recompute", type=click.Choice(RECOMPUTE), default="none",
                     show_default=True),
        click.option("--sequence-parallel", is_flag=True),
        click.option("--offload", type=click.Choice(["optimizer", "params"]), default=None),
        click.option("--num-microbatches", type=COUNT, default=None,
                     help="Micro-batches per step (pipeline in-flight = min(pp, this))."),
        click.option("--virtual-stages", type=COUNT, default=None,
                     help="Interleaved pipeline chunks per device."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def state_options(func: F) -> F:
    options = [
        click.option("--optimizer", type=click.Choice(["adam", "adamw", "sgd", "adafactor"]),
                     default="adam", show_default=True),
        click.option("--precision", type=click.Choice(["bf16-mixed", "bf16-pure", "fp32",
                                                       "mixed", "bf16"]),
                     default="bf16-mixed", show_default=True, help=PRECISION_HELP),
        click.option("--grad-dtype", type=click.Choice(GRAD_DTYPES), default=None,
                     help="Gradient dtype (default: the precision's and convention's: bf16 "
                     "under zero bf16-mixed, fp32 main grads under megatron)."),
        click.option("--attention-scores", type=click.Choice(["flash", "stored"]),
                     default="flash", show_default=True,
                     help="flash: FlashAttention/SDPA kernels keep no score matrix (Megatron, "
                     "llm-analysis assume it); stored: eager attention keeps 5*a*s^2*b bytes "
                     "per layer."),
        click.option("--flash-attention", is_flag=True, hidden=True,
                     help="Old spelling of --attention-scores flash (the default now)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def attention_is_flash(kw: dict[str, Any]) -> bool:
    """Pops --attention-scores / --flash-attention; True unless scores are stored."""
    scores = kw.pop("attention_scores")
    return bool(kw.pop("flash_attention")) or scores == "flash"


@cli.command("memory")
@model_options
@layout_options
@state_options
@click.option("--convention", type=click.Choice(MEMORY_CONVENTIONS), default="zero",
              show_default=True, help="Bytes-per-parameter convention.")
@click.option("--gpus-per-node", type=COUNT, default=None, help="DeepSpeed estimators only.")
@click.option("--largest-layer-params", type=NUMBER, default=None,
              help="DeepSpeed ZeRO-3 estimator only.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
def memory_cmd(**kw: Any) -> None:
    """Training memory per device: weights, grads, optimizer states, activations."""
    from ..calc.memory import canonical_precision, estimate

    params = kw["params"]
    spec, source = resolve_spec(kw, need_shape=False)
    as_json = kw.pop("as_json")
    flash = attention_is_flash(kw)
    est = estimate(spec, params=params, flash_attention=flash, **kw)
    if as_json:
        out = est.to_dict()
        out.update(precision=canonical_precision(kw["precision"]), grad_dtype=kw["grad_dtype"],
                   attention_scores="flash" if flash else "stored", model=source.to_dict())
        emit_json(out)
        return
    echo_memory(est)
    for line in source.lines():
        click.echo(f"note: {line}")


def echo_memory(est: MemoryEstimate, indent: str = "") -> None:
    gib = 2.0 ** 30
    rows = [("weights", est.weights_bytes), ("grads", est.grads_bytes),
            ("optimizer", est.optimizer_bytes), ("model states", est.model_states_bytes),
            ("activations", est.activations_bytes), ("total", est.total_bytes)]
    if est.host_bytes:
        rows.append(("host (offloaded)", est.host_bytes))
    for name, value in rows:
        click.echo(f"{indent}{name:<17}{value / gib:10.2f} GiB  {value:>18,.0f} B")
    for note in est.notes:
        click.echo(f"{indent}note: {note}")
