"""``stepscope plan``: parallel layouts that fit (wiring; math in ``calc.plan``)."""

from __future__ import annotations

from typing import Any

import click

from ..calc.plan import DEFAULT_HEADROOM
from ..errors import ConfigError
from .calc_memory import attention_is_flash, state_options
from .calc_options import COUNT, NUMBER, ModelSource, model_options, resolve_spec

__all__ = ["plan_cmd"]


def source_flags(source: ModelSource) -> str:
    """The model part of a pasteable command: --hf-config PATH or the shape flags."""
    if source.path is not None:
        return f"--hf-config {source.path}"
    return source.flags


def _emit(obj: Any) -> None:
    from .report import emit_json

    emit_json(obj)


@click.command("plan")
@model_options
@state_options
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
    spec, source = resolve_spec(kw)
    assert spec is not None
    kw["flash_attention"] = attention_is_flash(kw)
    from ..calc.plan import plan, smallest_need

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
        _emit({"devices": kw["devices"], "device_memory_bytes": memory_bytes,
                   "headroom": kw["headroom"], "global_batch": kw["global_batch"],
                   "layouts": [lay.to_dict() for lay in layouts]})
        return
    click.echo(f"{len(layouts)} layouts fit {kw['devices']} x {kw['device_memory_gb']:g} GB "
               f"({kw['headroom']:.0%} headroom); best first:")
    for i, lay in enumerate(layouts[:kw["limit"]], 1):
        click.echo(f"{i:>2}. DP{lay.dp} TP{lay.tp} PP{lay.pp} ZeRO-{lay.zero} "
                   f"recompute={lay.recompute} mb={lay.micro_batch}: {lay.why}")
        click.echo(f"    stepscope memory {source_flags(source)} {lay.flags()}")
