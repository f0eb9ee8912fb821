"""``stepscope plan``: parallel layouts that fit, ranked by estimated step time (wiring;
math in ``calc.plan`` and ``calc.steptime``)."""

from __future__ import annotations

import shlex
from typing import Any

import click

from ..calc.plan import DEFAULT_HEADROOM
from ..calc.steptime import DEFAULT_EFFICIENCY, Links
from ..errors import ConfigError
from . import cli
from .calc_memory import attention_is_flash, state_options
from .calc_options import COUNT, NUMBER, ModelSource, model_options, resolve_spec
from .common import emit_json

__all__ = ["plan_cmd", "source_flags"]

# Published MFU of comparable layouts, for the closing note (each with its source).
_PUBLISHED = ("38-43% for Llama 3 405B on 8k-16k H100 with TP8 x PP16 x CP x DP (Llama 3 "
              "paper, Dubey et al. 2024, Table 4); 52% of peak for GPT-3 175B on A100 with "
              "Megatron TP x PP x DP (Narayanan et al. 2021, Table 1)")
_PUBLISHED_RANGE = (0.38, 0.52)


def source_flags(source: ModelSource) -> str:
    """The model part of a pasteable command: --hf-config PATH or the shape flags."""
    if source.path is not None:
        out = f"--hf-config {shlex.quote(source.path)}"
        return out + (f" --seq-len {source.seq_len}" if source.seq_len else "")
    return source.flags


def _emit(obj: Any) -> None:
    emit_json(obj)


@cli.command("plan")
@model_options
@state_options
@click.option("--devices", type=COUNT, required=True, help="Devices available.")
@click.option("--device-memory-gb", type=NUMBER, required=True,
              help="Memory per device in GB (1e9 bytes; 80 for an 80 GB H100).")
@click.option("--global-batch", type=COUNT, required=True, help="Sequences per optimizer step.")
@click.option("--framework", type=click.Choice(["megatron", "deepspeed", "fsdp", "mindspore"]),
              default="megatron", show_default=True,
              help="Whose constraints apply and whose launch settings are printed.")
@click.option("--device", default=None, help="Device name (peak and default link bandwidths).")
@click.option("--dtype", default="bf16", show_default=True)
@click.option("--peak-tflops", type=NUMBER, default=None, help="Dense peak per device.")
@click.option("--intra-node-gbps", type=NUMBER, default=None,
              help="GB/s per GPU per direction inside a node (default: the device's NVLink).")
@click.option("--inter-node-gbps", type=NUMBER, default=None,
              help="GB/s per GPU per direction across nodes (default: one NIC per GPU).")
@click.option("--compute-efficiency", type=float, default=DEFAULT_EFFICIENCY,
              show_default=True, help="Share of the dense peak the matmuls reach.")
@click.option("--headroom", type=float, default=DEFAULT_HEADROOM, show_default=True,
              help="Share of device memory kept free.")
@click.option("--devices-per-node", type=COUNT, default=8, show_default=True,
              help="Largest tensor-parallel size (one NVLink domain).")
@click.option("--max-micro-batch", type=COUNT, default=8, show_default=True)
@click.option("--limit", type=COUNT, default=10, show_default=True,
              help="Layouts printed (--json lists all).")
@click.option("--json", "as_json", is_flag=True,
              help="{'layouts': [...fastest first], ...}; each with the memory --json keys.")
def plan_cmd(**kw: Any) -> None:
    """Parallel layouts that fit, fastest first by an estimated step time."""
    from ..calc.plan import plan, smallest_need

    seq_given = kw["seq_len"]
    spec, source = resolve_spec(kw)
    assert spec is not None
    source.seq_len = seq_given
    flash = attention_is_flash(kw)
    peak, links = _hardware(kw)
    common = {"devices_per_node": kw["devices_per_node"], "optimizer": kw["optimizer"],
              "precision": kw["precision"], "flash_attention": flash,
              "framework": kw["framework"]}
    layouts = plan(spec, kw["devices"], kw["device_memory_gb"] * 1e9, kw["global_batch"],
                   peak_flops=peak, links=links, headroom=kw["headroom"],
                   max_micro_batch=kw["max_micro_batch"], efficiency=kw["compute_efficiency"],
                   **common)
    if not layouts:
        need, flags = smallest_need(spec, kw["devices"], **common)
        raise ConfigError(f"no layout fits {kw['device_memory_gb']:g} GB with "
                          f"{kw['headroom']:.0%} headroom: the smallest needs "
                          f"{need.total_bytes / 1e9:.1f} GB per device ({flags}); add devices "
                          "or memory, or lower --seq-len/--global-batch")
    model = source_flags(source)
    if kw["as_json"]:
        rows = [dict(lay.to_dict(), memory_command=f"stepscope memory {model} {lay.flags()}")
                for lay in layouts]
        _emit({"devices": kw["devices"], "device_memory_bytes": kw["device_memory_gb"] * 1e9,
               "headroom": kw["headroom"], "global_batch": kw["global_batch"],
               "framework": kw["framework"], "peak_flops_per_device": peak,
               "links": {"intra_bytes_per_s": links.intra_bytes_per_s,
                         "inter_bytes_per_s": links.inter_bytes_per_s,
                         "source": links.source}, "layouts": rows})
        return
    _echo(layouts, kw, model, peak, links)


def _hardware(kw: dict[str, Any]) -> tuple[float, Links]:
    from ..calc.hardware import require_peak
    from ..calc.steptime import links_for

    if kw["peak_tflops"] is not None:
        peak, name = kw["peak_tflops"] * 1e12, None
    elif kw["device"] is not None:
        entry = require_peak(kw["device"], kw["dtype"])
        peak, name = entry.flops, entry.device
    else:
        raise ConfigError("plan ranks by estimated step time: give --device NAME (its dense "
                          "peak and link bandwidths) or --peak-tflops P with "
                          "--intra-node-gbps and --inter-node-gbps")
    default = links_for(name) if name else None
    intra, inter = kw["intra_node_gbps"], kw["inter_node_gbps"]
    if default is None:
        if intra is None or inter is None:
            raise ConfigError(f"no default link bandwidths for {name or 'this device'}: give "
                              "--intra-node-gbps and --inter-node-gbps (GB/s per GPU per "
                              "direction)")
        return peak, Links(intra * 1e9, inter * 1e9, "given on the command line")
    if intra is None and inter is None:
        return peak, default
    return peak, Links(intra * 1e9 if intra else default.intra_bytes_per_s,
                       inter * 1e9 if inter else default.inter_bytes_per_s,
                       f"given on the command line, else {default.source}")


def _echo(layouts: list[Any], kw: dict[str, Any], model: str, peak: float,
          links: Links) -> None:
    click.echo(f"{len(layouts)} layouts fit {kw['devices']} x {kw['device_memory_gb']:g} GB "
               f"({kw['headroom']:.0%} headroom, {kw['framework']}); fastest first by "
               f"estimated step time (compute at {kw['compute_efficiency']:.0%} of "
               f"{peak / 1e12:g} TFLOP/s; links: {links.source}):")
    for i, lay in enumerate(layouts[:kw["limit"]], 1):
        ep = f" EP{lay.ep}" if lay.ep > 1 else ""
        cp = f" CP{lay.cp}" if lay.cp > 1 else ""
        click.echo(f"{i:>2}. DP{lay.dp} TP{lay.tp} PP{lay.pp}{cp}{ep} ZeRO-{lay.zero} "
                   f"recompute={lay.recompute} mb={lay.micro_batch}: {lay.why}")
        click.echo(f"    launch: {lay.settings}".replace("\n", " | "))
        click.echo(f"    stepscope memory {model} {lay.flags()}")
    top = ", ".join(f"#{i} {lay.estimate.step_s:.2f} s / MFU {lay.estimate.mfu:.1%}"
                    for i, lay in enumerate(layouts[:5], 1) if lay.estimate)
    best = layouts[0].estimate.mfu if layouts[0].estimate else 0.0
    where = ("above" if best > _PUBLISHED_RANGE[1] else "below" if best < _PUBLISHED_RANGE[0]
             else "within")
    click.echo(f"note: top five: {top}. The best estimate (MFU {best:.1%}) is {where} the "
               f"{_PUBLISHED_RANGE[0]:.0%}-{_PUBLISHED_RANGE[1]:.0%} published for similar "
               f"layouts: {_PUBLISHED}. The estimate assumes the stated compute efficiency "
               "for every matmul size and peak link bandwidths (a lower bound on time; "
               "smaller per-device chunks under TP/CP run slower than modelled): measure "
               "one step with stepscope run before trusting the ranking.")
