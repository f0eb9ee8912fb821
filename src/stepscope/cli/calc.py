"""Calculator commands: ``mfu``, ``memory``, ``plan`` (wiring only; math in ``calc/``).

    stepscope mfu  (--hf-config PATH | --params N | shape flags) [--seq-len T]
                   [--global-batch B]                                   FLOPs only, or
                   (--tokens-per-s X | --step-time S --global-batch B) --devices G
                   (--device NAME [--dtype bf16] | --peak-tflops P)     MFU and HFU
                   [--recompute none|selective|full] [--convention palm|...] [--json]
    stepscope memory (--hf-config PATH | --params N | shape flags) [--dp --tp --pp --ep
                   --cp --zero 0..3 --optimizer adam --precision bf16-mixed|... ] [--json]
    stepscope plan [model flags] --devices N --device-memory-gb M [--global-batch B] [--json]

Numbers accept ``7e9``, ``7B``, ``7000M``, ``32k``, ``1.5T``. The model flags and the number
parser live in :mod:`stepscope.cli.calc_options`; ``plan`` in :mod:`stepscope.cli.calc_plan`.
"""

from __future__ import annotations

from typing import Any

import click

from ..calc.flops import CONVENTIONS, RECOMPUTE, FlopsEstimate, ModelSpec
from ..calc.hardware import PeakEntry
from ..errors import ConfigError, UnknownDeviceError
from . import cli
from .calc_options import COUNT, NUMBER, ModelSource, model_options, parse_number, resolve_spec
from .common import emit_json

__all__ = ["parse_number", "NUMBER", "COUNT"]


@cli.command("mfu")
@model_options
@click.option("--tokens-per-s", type=NUMBER, default=None,
              help="Tokens per second over all devices (omit for FLOPs only).")
@click.option("--step-time", type=NUMBER, default=None, help="Seconds per optimizer step.")
@click.option("--global-batch", type=COUNT, default=None,
              help="Sequences per optimizer step (micro-batch x grad-accum x DP); alone: "
              "FLOPs per step.")
@click.option("--devices", type=COUNT, default=None, help="Number of devices G.")
@click.option("--device", default=None, help="Device name as the framework reports it, or "
              "'cpu' for this machine.")
@click.option("--dtype", default="bf16", show_default=True, help="fp32, tf32, bf16, fp16, fp8.")
@click.option("--peak-tflops", type=NUMBER, default=None, help="Dense peak per device, TFLOP/s.")
@click.option("--cores", type=COUNT, default=None,
              help="--device cpu: threads the run used (default: every core this process "
              "may use; stepscope run counts the framework's intra-op threads).")
@click.option("--cpu-clock-ghz", type=NUMBER, default=None,
              help="--device cpu: a measured or all-core clock (default: cpufreq maximum, "
              "else the microarchitecture's boost ceiling, so MFU is never overstated).")
@click.option("--tp", type=COUNT, default=1, show_default=True,
              help="Tensor parallel size (only pads the vocabulary with --vocab-divisor).")
@click.option("--recompute", type=click.Choice(RECOMPUTE), default="none", show_default=True)
@click.option("--recompute-fraction", type=float, default=1.0, show_default=True,
              help="Share of the dense forward re-run by full recompute (PaLM 540B: 0.75).")
@click.option("--convention", type=click.Choice(CONVENTIONS), default="palm", show_default=True)
@click.option("--causal/--no-causal", default=None,
              help="Halve the attention term (default: only the megatron convention does).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
def mfu_cmd(**kw: Any) -> None:
    """FLOPs per token of a model; with a throughput and a peak, MFU and HFU."""
    from ..calc.flops import check_utilization, hfu, mfu

    params, seq_len = kw["params"], kw["seq_len"]
    spec, source = _mfu_spec(kw)
    estimates = _estimates(spec, kw, params)
    est = estimates[kw["convention"]]
    result: dict[str, Any] = {
        "flops_per_token": est.flops_per_token,
        "hardware_flops_per_token": est.hardware_flops_per_token, "mfu": None, "hfu": None,
        "convention": est.convention, "recompute": est.recompute, "causal": est.causal,
        "formula": est.formula, "source": est.source,
        "by_convention": {name: {"flops_per_token": e.flops_per_token,
                                 "hardware_flops_per_token": e.hardware_flops_per_token}
                          for name, e in estimates.items()},
        "model": source.to_dict()}
    seq_len = spec.seq_len if spec is not None else seq_len
    if kw["tokens_per_s"] is None and kw["step_time"] is None:
        _flops_only(result, kw, seq_len, source)
        return
    tokens_per_s = _tokens_per_s(kw, seq_len)
    peak = _peak(kw)
    if kw["devices"] is None:
        raise ConfigError("MFU needs the device count: give --devices G (every device of the "
                          "run, all nodes)")
    result["mfu"] = mfu(tokens_per_s, est.flops_per_token, peak.flops, kw["devices"])
    result["hfu"] = hfu(tokens_per_s, est.hardware_flops_per_token, peak.flops, kw["devices"])
    check_utilization("MFU", result["mfu"])
    check_utilization("HFU", result["hfu"])
    result.update({"peak_flops_per_device": peak.flops, "tokens_per_s": tokens_per_s,
                   "devices": kw["devices"], "peak_device": peak.device,
                   "peak_dtype": peak.dtype, "peak_source": peak.source,
                   "peak_note": peak.note})
    if kw["as_json"]:
        _emit(result)
        return
    _echo_mfu(result, est, peak, source)


def _echo_mfu(result: dict[str, Any], est: FlopsEstimate, peak: PeakEntry,
              source: ModelSource) -> None:
    click.echo(f"MFU {result['mfu']:.2%}  HFU {result['hfu']:.2%}  "
               f"({result['tokens_per_s']:,.0f} tokens/s on {result['devices']} x "
               f"{peak.device} {peak.dtype} {peak.flops / 1e12:g} TFLOP/s)")
    click.echo(f"FLOPs/token {est.flops_per_token:,.0f} model, "
               f"{est.hardware_flops_per_token:,.0f} hardware (recompute {est.recompute})")
    click.echo(f"convention {est.convention}: {est.formula}  [{est.source}]")
    click.echo(f"peak: {peak.source}" + (f" ({peak.note})" if peak.note else ""))
    for line in source.lines():
        click.echo(f"note: {line}")


def _mfu_spec(kw: dict[str, Any]) -> tuple[ModelSpec | None, ModelSource]:
    """The model; ``--convention 6n --params N`` needs no shape."""
    six_n_only = (kw["convention"] == "6n" and kw["params"] is not None and kw["hf_config"] is None
                  and kw["layers"] is None and kw["hidden"] is None)
    return resolve_spec(kw, need_shape=not six_n_only)


def _estimates(spec: ModelSpec | None, kw: dict[str, Any],
               params: float | None) -> dict[str, FlopsEstimate]:
    """The chosen convention first, then every other one the model allows."""
    from ..calc.flops import flops_per_token, six_n_flops

    if spec is None:
        assert params is not None
        return {"6n": six_n_flops(params, kw["recompute"])}
    out = {kw["convention"]: flops_per_token(spec, kw["convention"], kw["recompute"],
                                             kw["causal"], kw["recompute_fraction"], kw["tp"])}
    for name in CONVENTIONS:
        if name in out:
            continue
        try:
            out[name] = flops_per_token(spec, name, kw["recompute"], None,
                                        kw["recompute_fraction"], kw["tp"])
        except ConfigError:
            continue  # e.g. megatron without --vocab: only the chosen one must work
    return out


def _flops_only(result: dict[str, Any], kw: dict[str, Any], seq_len: int | None,
                source: ModelSource) -> None:
    step_tokens = (kw["global_batch"] * seq_len
                   if kw["global_batch"] is not None and seq_len else None)
    if step_tokens is not None:
        result["flops_per_step"] = step_tokens * result["flops_per_token"]
        for row in result["by_convention"].values():
            row["flops_per_step"] = step_tokens * row["flops_per_token"]
    if kw["as_json"]:
        _emit(result)
        return
    click.echo("FLOPs per trained token (forward + backward), by convention"
               + (f"; per step of {kw['global_batch']} x {seq_len} tokens" if step_tokens
                  else "") + ":")
    for name, row in result["by_convention"].items():
        mark = "*" if name == result["convention"] else " "
        line = f"{mark} {name:<14}{row['flops_per_token']:>22,.0f}"
        if row["hardware_flops_per_token"] != row["flops_per_token"]:
            line += f"  hardware {row['hardware_flops_per_token']:,.0f}"
        if step_tokens:
            line += f"  step {row['flops_per_step']:.4g}"
        click.echo(line)
    click.echo(f"* {result['convention']}: {result['formula']}  [{result['source']}]")
    click.echo("MFU/HFU: add --tokens-per-s X (or --step-time S --global-batch B), --devices G "
               "and --device NAME or --peak-tflops P")
    for line in source.lines():
        click.echo(f"note: {line}")


def _emit(obj: Any) -> None:
    emit_json(obj)


def _tokens_per_s(kw: dict[str, Any], seq_len: int | None) -> float:
    if kw["tokens_per_s"] is not None:
        if kw["step_time"] is not None:
            raise ConfigError("give --tokens-per-s or --step-time with --global-batch, not both")
        return float(kw["tokens_per_s"])
    if kw["step_time"] is None or kw["global_batch"] is None or not seq_len:
        raise ConfigError("give --tokens-per-s X, or --step-time S with --global-batch B and "
                          "--seq-len T (sequences per optimizer step, accumulation included)")
    if kw["step_time"] <= 0:
        raise ConfigError(f"--step-time must be positive, got {kw['step_time']}")
    return float(kw["global_batch"] * seq_len / kw["step_time"])


def _peak(kw: dict[str, Any]) -> PeakEntry:
    from ..calc.hardware import is_host_cpu, normalize_dtype, require_peak

    if kw["peak_tflops"] is not None:
        if kw["device"] is not None:
            raise ConfigError("give --device NAME or --peak-tflops P, not both")
        return PeakEntry(device="given", dtype=kw["dtype"], flops=kw["peak_tflops"] * 1e12,
                         source="--peak-tflops")
    if kw["device"] is None:
        raise ConfigError("MFU needs a peak: give --device NAME (as torch.cuda.get_device_name() "
                          "prints it, or 'cpu') or --peak-tflops P; drop the throughput for "
                          "FLOPs only")
    if is_host_cpu(kw["device"]):
        from ..record.host import cpu_peak_here

        clock = kw["cpu_clock_ghz"] * 1e3 if kw["cpu_clock_ghz"] else None
        entry, why = cpu_peak_here(normalize_dtype(kw["dtype"]), kw["cores"], clock)
        if entry is None:
            raise UnknownDeviceError(why)
        return entry
    return require_peak(kw["device"], kw["dtype"])
