"""Calculator commands: ``mfu``, ``memory``, ``plan`` (wiring only; math in ``calc/``).

    stepscope mfu  [--params N | shape flags] --layers L --hidden H --seq-len T
                   (--tokens-per-s X | --step-time S --global-batch B) --devices G
                   (--device NAME [--dtype bf16] | --peak-tflops P)
                   [--recompute none|selective|full] [--convention palm|...] [--json]
    stepscope memory [--params N | shape flags] [--dp --tp --pp --zero 0..3 --optimizer adam
                   --precision mixed|bf16|fp32 --micro-batch b --recompute ...
                   --sequence-parallel --offload optimizer|params] [--json]
    stepscope plan [model flags] --devices N --device-memory-gb M [--global-batch B] [--json]

Numbers accept ``7e9``, ``7B``, ``7000M``, ``32k``, ``1.5T``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

import click

from ..calc.flops import CONVENTIONS, RECOMPUTE, ModelSpec, flops_per_token, hfu, mfu
from ..calc.hardware import PeakEntry, require_peak
from ..calc.memory import MEMORY_CONVENTIONS, MemoryEstimate, estimate
from ..calc.plan import DEFAULT_HEADROOM, plan, smallest_need
from ..errors import ConfigError
from . import cli
from .common import emit_json

__all__ = ["parse_number", "NUMBER", "COUNT"]

F = TypeVar("F", bound=Callable[..., Any])
_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_number(text: str) -> float:
    """'7e9', '7B', '7000M', '32k', '1.5T', '4096' -> float (SI suffixes, 1k = 1000)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)\s*", text.lower())
    if not m:
        raise ValueError(f"{text!r} is not a number (examples: 7e9, 7B, 7000M, 32k)")
    return float(m.group(1)) * _SUFFIX[m.group(2)]


class _Number(click.ParamType):  # type: ignore[type-arg]  # generic only since click 8.2
    name = "number"

    def __init__(self, integer: bool = False) -> None:
        self.integer = integer

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float | int:
        if isinstance(value, (int, float)):
            return value
        try:
            number = parse_number(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if self.integer:
            if number != int(number):
                self.fail(f"{value!r} must be a whole number", param, ctx)
            return int(number)
        return number


NUMBER = _Number()
COUNT = _Number(integer=True)


def _model_options(func: F) -> F:
    """The model flags shared by mfu, memory and plan."""
    options = [
        click.option("--params", type=NUMBER, default=None,
                     help="Parameter count (overrides the count from the shape)."),
        click.option("--layers", type=COUNT, default=None, help="Transformer layers L."),
        click.option("--hidden", type=COUNT, default=None, help="Hidden width h."),
        click.option("--seq-len", type=COUNT, default=None, help="Sequence length T."),
        click.option("--heads", type=COUNT, default=None, help="Query heads (default: "
                     "attention width = hidden)."),
        click.option("--head-dim", type=COUNT, default=None, help="Head dimension."),
        click.option("--kv-heads", type=COUNT, default=None, help="KV heads (GQA/MQA)."),
        click.option("--ffn-hidden", type=COUNT, default=None, help="FFN width (default 4h)."),
        click.option("--vocab", type=COUNT, default=0, help="Vocabulary size."),
        click.option("--swiglu", is_flag=True, help="Gated (SwiGLU) MLP: 3 matrices."),
        click.option("--tied-embeddings", is_flag=True, help="LM head shares the embedding."),
        click.option("--moe-experts", type=COUNT, default=0, help="Routed experts (0: dense)."),
        click.option("--moe-top-k", type=COUNT, default=1, help="Experts per token."),
        click.option("--moe-shared-experts", type=COUNT, default=0, help="Shared experts."),
        click.option("--position-embeddings", type=COUNT, default=0,
                     help="Rows of a learned position table (GPT-2: the context length)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _spec(kw: dict[str, Any], need_shape: bool = True) -> ModelSpec | None:
    """Build the ModelSpec from the model flags (pops them from ``kw``)."""
    keys = ("params", "layers", "hidden", "seq_len", "heads", "head_dim", "kv_heads",
            "ffn_hidden", "vocab", "swiglu", "tied_embeddings", "moe_experts", "moe_top_k",
            "moe_shared_experts", "position_embeddings")
    args = {k: kw.pop(k) for k in keys}
    missing = [k for k in ("layers", "hidden", "seq_len") if args[k] is None]
    if missing:
        if not need_shape and args["params"] is not None and len(missing) == 3:
            return None
        flags = " ".join(f"--{k.replace('_', '-')}" for k in missing)
        raise ConfigError(f"missing {flags}: the attention and activation terms need layers, "
                          "hidden and seq-len (also with --params)")
    if args["params"] is None and args["vocab"] <= 0:
        raise ConfigError("give --params N, or --vocab V with the shape flags to count them")
    return ModelSpec(**args)


@cli.command("mfu")
@_model_options
@click.option("--tokens-per-s", type=NUMBER, default=None,
              help="Tokens per second over all devices.")
@click.option("--step-time", type=NUMBER, default=None, help="Seconds per optimizer step.")
@click.option("--global-batch", type=COUNT, default=None,
              help="Sequences per optimizer step (micro-batch x grad-accum x DP).")
@click.option("--devices", type=COUNT, required=True, help="Number of devices G.")
@click.option("--device", default=None, help="Device name as the framework reports it, or "
              "'cpu' for this machine.")
@click.option("--dtype", default="bf16", show_default=True, help="fp32, tf32, bf16, fp16, fp8.")
@click.option("--peak-tflops", type=NUMBER, default=None, help="Dense peak per device, TFLOP/s.")
@click.option("--recompute", type=click.Choice(RECOMPUTE), default="none", show_default=True)
@click.option("--recompute-fraction", type=float, default=1.0, show_default=True,
              help="Share of the dense forward re-run by full recompute (PaLM 540B: 0.75).")
@click.option("--convention", type=click.Choice(CONVENTIONS), default="palm", show_default=True)
@click.option("--causal/--no-causal", default=None,
              help="Halve the attention term (default: only the megatron convention does).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
def mfu_cmd(**kw: Any) -> None:
    """Model and hardware FLOPs utilization of a training run."""
    spec = _spec(kw)
    assert spec is not None
    est = flops_per_token(spec, kw["convention"], kw["recompute"], kw["causal"],
                          kw["recompute_fraction"])
    tokens_per_s = _tokens_per_s(kw, spec.seq_len)
    peak = _peak(kw)
    result = {
        "flops_per_token": est.flops_per_token,
        "hardware_flops_per_token": est.hardware_flops_per_token,
        "mfu": mfu(tokens_per_s, est.flops_per_token, peak.flops, kw["devices"]),
        "hfu": hfu(tokens_per_s, est.hardware_flops_per_token, peak.flops, kw["devices"]),
        "peak_flops_per_device": peak.flops, "convention": est.convention,
        "recompute": est.recompute, "causal": est.causal, "tokens_per_s": tokens_per_s,
        "devices": kw["devices"], "peak_device": peak.device, "peak_dtype": peak.dtype,
        "peak_source": peak.source, "formula": est.formula, "source": est.source,
    }
    if kw["as_json"]:
        emit_json(result)
        return
    click.echo(f"MFU {result['mfu']:.2%}  HFU {result['hfu']:.2%}  "
               f"({tokens_per_s:,.0f} tokens/s on {kw['devices']} x {peak.device} "
               f"{peak.dtype} {peak.flops / 1e12:g} TFLOP/s)")
    click.echo(f"FLOPs/token {est.flops_per_token:,.0f} model, "
               f"{est.hardware_flops_per_token:,.0f} hardware (recompute {est.recompute})")
    click.echo(f"convention {est.convention}: {est.formula}  [{est.source}]")
    click.echo(f"peak: {peak.source}")


def _tokens_per_s(kw: dict[str, Any], seq_len: int) -> float:
    if kw["tokens_per_s"] is not None:
        if kw["step_time"] is not None:
            raise ConfigError("give --tokens-per-s or --step-time with --global-batch, not both")
        return float(kw["tokens_per_s"])
    if kw["step_time"] is None or kw["global_batch"] is None:
        raise ConfigError("give --tokens-per-s X, or --step-time S with --global-batch B "
                          "(sequences per optimizer step, gradient accumulation included)")
    if kw["step_time"] <= 0:
        raise ConfigError(f"--step-time must be positive, got {kw['step_time']}")
    return float(kw["global_batch"] * seq_len / kw["step_time"])


def _peak(kw: dict[str, Any]) -> PeakEntry:
    if kw["peak_tflops"] is not None:
        if kw["device"] is not None:
            raise ConfigError("give --device NAME or --peak-tflops P, not both")
        return PeakEntry(device="given", dtype=kw["dtype"], flops=kw["peak_tflops"] * 1e12,
                         source="--peak-tflops")
    if kw["device"] is None:
        raise ConfigError("give --device NAME (as torch.cuda.get_device_name() prints it, or "
                          "'cpu') or --peak-tflops P")
    return require_peak(kw["device"], kw["dtype"])


def _layout_options(func: F) -> F:
    options = [
        click.option("--dp", type=COUNT, default=1, show_default=True),
        click.option("--tp", type=COUNT, default=1, show_default=True),
        click.option("--pp", type=COUNT, default=1, show_default=True),
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


def _state_options(func: F) -> F:
    options = [
        click.option("--optimizer", type=click.Choice(["adam", "adamw", "sgd", "adafactor"]),
                     default="adam", show_default=True),
        click.option("--precision", type=click.Choice(["mixed", "bf16", "fp32"]),
                     default="mixed", show_default=True),
        click.option("--flash-attention", is_flag=True,
                     help="No stored attention scores (FlashAttention/SDPA kernels)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


@cli.command("memory")
@_model_options
@_layout_options
@_state_options
@click.option("--convention", type=click.Choice(MEMORY_CONVENTIONS), default="zero",
              show_default=True, help="Bytes-per-parameter convention.")
@click.option("--gpus-per-node", type=COUNT, default=None, help="DeepSpeed estimators only.")
@click.option("--largest-layer-params", type=NUMBER, default=None,
              help="DeepSpeed ZeRO-3 estimator only.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
def memory_cmd(**kw: Any) -> None:
    """Training memory per device: weights, grads, optimizer states, activations."""
    params = kw["params"]
    spec = _spec(kw, need_shape=False)
    as_json = kw.pop("as_json")
    est = estimate(spec, params=params, **kw)
    if as_json:
        emit_json(est.to_dict())
        return
    _echo_memory(est)


def _echo_memory(est: MemoryEstimate, indent: str = "") -> None:
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


@cli.command("plan")
@_model_options
@_state_options
@click.option("--devices", type=COUNT, required=True, help="Devices available.")
@click.option("--device-memory-gb", type=NUMBER, required=True,
              help="Memory per device in GB (1e9 bytes; 80 for an 80 GB H100).")
@click.option("--global-batch", type=COUNT, default=None, help="Sequences per optimizer step.")
@click.option("--headroom", type=float, default=DEFAULT_HEADROOM, show_default=True,
              help="Share of device memory kept free.")
@click.option("--devices-per-node", type=COUNT, default=8, show_default=True,
              help="Largest tensor-parallel size (one NVLink domain).")
@click.option("--max-micro-batch", type=COUNT, default=8, show_default=True)
@click.option("--limit", type=COUNT, default=10, show_default=True,
              help="Layouts printed (--json lists all).")
@click.option("--json", "as_json", is_flag=True,
              help="{'layouts': [...best first], ...}; each with the memory --json keys.")
def plan_cmd(**kw: Any) -> None:
    """Parallel layouts that fit, best first (pipeline before tensor parallel)."""
    spec = _spec(kw)
    assert spec is not None
    memory_bytes = kw["device_memory_gb"] * 1e9
    layouts = plan(spec, kw["devices"], memory_bytes, kw["global_batch"],
                   headroom=kw["headroom"], devices_per_node=kw["devices_per_node"],
                   optimizer=kw["optimizer"], precision=kw["precision"],
                   max_micro_batch=kw["max_micro_batch"], flash_attention=kw["flash_attention"])
    if not layouts:
        need, flags = smallest_need(spec, kw["devices"], devices_per_node=kw["devices_per_node"],
                                    optimizer=kw["optimizer"], precision=kw["precision"],
                                    flash_attention=kw["flash_attention"])
        raise ConfigError(f"no layout fits {kw['device_memory_gb']:g} GB with "
                          f"{kw['headroom']:.0%} headroom: the smallest needs "
                          f"{need.total_bytes / 1e9:.1f} GB per device ({flags}); add devices "
                          "or memory, or lower --seq-len/--global-batch")
    if kw["as_json"]:
        emit_json({"devices": kw["devices"], "device_memory_bytes": memory_bytes,
                   "headroom": kw["headroom"], "global_batch": kw["global_batch"],
                   "layouts": [lay.to_dict() for lay in layouts]})
        return
    click.echo(f"{len(layouts)} layouts fit {kw['devices']} x {kw['device_memory_gb']:g} GB "
               f"({kw['headroom']:.0%} headroom); best first:")
    for i, lay in enumerate(layouts[:kw["limit"]], 1):
        click.echo(f"{i:>2}. DP{lay.dp} TP{lay.tp} PP{lay.pp} ZeRO-{lay.zero} "
                   f"recompute={lay.recompute} mb={lay.micro_batch}: {lay.why}")
        click.echo(f"    stepscope memory ... {lay.flags()}")
