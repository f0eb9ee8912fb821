"""A recorded run read under another FLOPs convention (``report --flops-convention NAME``).

``stepscope run`` records, beside the convention it used, the FLOPs per token of every
convention it could compute for the model (run.json ``environment.flops_by_convention``,
see ``calc/flopsrun.py``). Choosing one here swaps the run's FLOPs fields, so
MFU and HFU follow the chosen convention and the sheet names it.

Example::

    meta = with_flops_convention(RunDir("runs/a").read_meta(), "palm")
    meta.environment["flops_convention"]     # "palm: 6*N + 12*L*H*Q*T (PaLM ...)"
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import ConfigError
from ..schema import RunMeta

__all__ = ["with_flops_convention", "FLOPS_FIELDS"]

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
