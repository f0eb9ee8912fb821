"""A run's MFU and HFU: its recorded throughput with run.json's FLOPs and device peak, under
the FLOPs convention the run recorded or another one it also recorded.

``stepscope run`` records, beside the convention it used, the FLOPs per token of every
convention it could compute for the model (run.json ``environment.flops_by_convention``,
see ``calc/flopsrun.py``). :func:`with_flops_convention` swaps the run's
FLOPs fields for one of them (``report --flops-convention NAME``), so the MFU and HFU of
:func:`run_mfu` follow the chosen convention and the sheet names it.

Example::

    meta = with_flops_convention(RunDir("runs/a").read_meta(), "palm")
    meta.environment["flops_convention"]     # "palm: 6*N + 12*L*H*Q*T (PaLM ...)"
    mfu, hfu, note = run_mfu(sheet.tokens_per_s, meta, ranks=2)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..calc import flops
from ..errors import ConfigError
from ..schema import RunMeta

__all__ = ["run_mfu", "with_flops_convention", "FLOPS_FIELDS"]


def run_mfu(tokens_per_s: float | None, meta: RunMeta | None, ranks: int = 1,
            samples_per_s: float | None = None) -> tuple[float | None, float | None, str]:
    """(MFU, HFU, note) of a throughput with run.json's FLOPs and device peak.

    Per token (``flops_per_token``) where tokens were counted, else per sample
    (``flops_per_sample``: a network whose FLOPs were counted from the model, such as a
    CNN or an MLP, whose inputs are no token ids). The one MFU of reports, ledgers, the
    index and the demo's live progress line; the formula is the calculator's
    (:func:`stepscope.calc.flops.mfu`: rate x FLOPs per unit / (peak x devices)).
    Devices: run.json's ``num_devices``, else ``ranks``. Unknown inputs give None and the
    note says which.

    Example::

        mfu, hfu, note = run_mfu(sheet.tokens_per_s, run.read_meta(), ranks=2)
    """
    env = meta.environment if meta else {}
    rate, unit = tokens_per_s, "token"
    if not (rate and rate > 0 and _positive(env.get("flops_per_token"))) and \
            samples_per_s and samples_per_s > 0 and _positive(env.get("flops_per_sample")):
        rate, unit = samples_per_s, "sample"
    per_unit = _positive(env.get(f"flops_per_{unit}"))
    peak = _positive(env.get("peak_flops_per_device"))
    if rate is None or not rate > 0:
        return None, None, "no token counts recorded"
    if per_unit is None:
        return None, None, "model FLOPs per token unknown (record flops_per_token)"
    if peak is None:
        return None, None, str(env.get("peak_flops_source") or "device peak FLOP/s unknown")
    devices = max(1, int((meta.baseline.get("num_devices") if meta else None) or ranks or 1))
    hw = _positive(env.get(f"hardware_flops_per_{unit}")) or per_unit
    conv = env.get("flops_convention", "unspecified convention")
    src = env.get("peak_flops_source", "unspecified source")
    return (flops.mfu(rate, per_unit, peak, devices),
            flops.hfu(rate, hw, peak, devices),
            f"{conv}; per {unit}; peak {peak / 1e12:.3g} TFLOP/s per device ({src})")


def _positive(v: Any) -> float | None:
    """``v`` as a float when it is a finite positive number, else None."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) and x > 0 else None


FLOPS_FIELDS = ("flops_per_token", "hardware_flops_per_token", "flops_per_sample",
                "hardware_flops_per_sample", "flops_convention")


def with_flops_convention(meta: RunMeta, name: str) -> RunMeta:
    """``meta`` with the FLOPs fields of convention ``name`` (a new RunMeta; ``meta`` is
    not changed). ConfigError when the run did not record that convention."""
    table: dict[str, Any] = meta.environment.get("flops_by_convention") or {}
    if name not in table:
        have = ", ".join(sorted(table)) or "none (recorded before conventions were kept)"
        raise ConfigError(f"{meta.run_id or 'this run'} has no FLOPs count under convention "
                          f"{name!r} (it needs the model's layers, heads and hidden width, "
                          f"read from model.config); recorded: {have}")
    env = {k: v for k, v in meta.environment.items() if k not in FLOPS_FIELDS}
    env.update({k: table[name][k] for k in FLOPS_FIELDS if k in table[name]})
    return dataclasses.replace(meta, environment=env)
