"""run.json checked field by field: a wrong-typed field is dropped with a message, not fatal.

``"environment": [1]`` or ``"baseline": "str"`` once raised AttributeError in every command.
Here each top-level field of :class:`~stepscope.schema.RunMeta` and
each numeric baseline/environment variable that analyses compute with is checked against
the table below; a field of the wrong type is dropped and named in the returned problems
(the store turns them into warnings). Only a missing or unusable ``run_id`` stays fatal.

Example::

    cleaned, problems = clean_meta({"run_id": "r", "environment": [1]})
    cleaned    # {"run_id": "r"}
    problems   # ["'environment' is a list, expected an object; dropped"]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["clean_meta"]

_TOP: dict[str, tuple[type, ...]] = {
    "run_id": (str,), "name": (str,), "created_utc": (str,), "status": (str,),
    "error": (str, type(None)), "command": (list, type(None)),
    "baseline": (dict,), "environment": (dict,), "config": (dict,), "schema_version": (int,),
}
# Variables the analyses use in arithmetic (summary, MFU, index, scaling, compare).
_NUMERIC = {
    "baseline": ("num_params", "num_layers", "hidden_size", "num_heads", "seq_len",
                 "vocab_size", "num_samples", "num_devices", "dp", "tp", "pp", "zero_stage",
                 "global_batch", "micro_batch", "grad_accum", "lr", "warmup_steps",
                 "weight_decay", "seed"),
    "environment": ("peak_flops_per_device", "flops_per_token", "hardware_flops_per_token"),
}
_JSON_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean",
               list: "a list", dict: "an object", type(None): "null"}


def _kind(v: Any) -> str:
    return _JSON_NAMES.get(type(v), type(v).__name__)


def _is_number(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, (int, float)):
        return math.isfinite(v)
    if isinstance(v, str):  # "8" was accepted before and computes fine
        try:
            return math.isfinite(float(v))
        except ValueError:
            return False
    return v is None


def _top_ok(name: str, v: Any) -> bool:
    types = _TOP[name]
    if isinstance(v, bool) and bool not in types:
        return False
    if name == "command" and isinstance(v, list):
        return all(isinstance(x, str) for x in v)
    return isinstance(v, types)


def clean_meta(raw: Any) -> tuple[dict[str, Any], list[str]]:
    """(run.json without its wrong-typed fields, one line per dropped field).

    Raises ValueError when ``raw`` is not a JSON object (nothing can be salvaged).
    """
    if not isinstance(raw, Mapping):
        raise ValueError(f"run.json holds {_kind(raw)}, expected an object")
    out: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in raw.items():
        if key in _TOP and not _top_ok(key, value):
            if key == "run_id" and isinstance(value, (int, float)) and not isinstance(
                    value, bool):
                out[key] = str(value)
                continue
            expected = " or ".join(_JSON_NAMES[t] for t in _TOP[key])
            problems.append(f"{key!r} is {_kind(value)}, expected {expected}; dropped")
            continue
        out[key] = value
    for section, names in _NUMERIC.items():
        part = out.get(section)
        if not isinstance(part, dict):
            continue
        bad = [n for n in names if n in part and not _is_number(part[n])]
        if bad:
            out[section] = {k: v for k, v in part.items() if k not in bad}
            problems += [f"{section}.{n} is {_kind(part[n])}, expected a number; dropped"
                         for n in bad]
    return out, problems
