"""Evaluation results a framework reports, as the run's eval events (compare's quality ledger).

One event per evaluation, ``{"type": "eval", "step": N, "metrics": {...}, "source": ...}``
(:func:`stepscope.schema.eval_record` plus where the values came from).
``step`` is the number of optimizer steps recorded before the evaluation: the Trainer's
and Lightning's ``global_step``, nanoGPT's ``iter_num`` at its ``estimate_loss``; the
evaluation follows row ``N - 1`` of the step table (``N = 0``: before any training).

* Hugging Face Trainer: the ``metrics`` of ``on_evaluate`` (``eval_loss`` and what
  ``compute_metrics`` adds), without the Trainer's timing keys and ``epoch``;
* Lightning: the validation (or test) loop's own epoch-level metrics at its end
  (``val_loss`` ...), not the training metrics also in ``callback_metrics``. The sanity
  check before training is not recorded: it runs ``num_sanity_val_steps`` batches only
  and Lightning itself logs nothing of it.

Used by the callbacks (:mod:`.hf`, :mod:`.lightning`) and by ``stepscope run``'s framework
hooks (:mod:`.torch.frameworks`); framework-free, the objects are duck-typed.

Example::

    event = eval_event(12, hf_metrics({"eval_loss": 2.5, "eval_runtime": 0.4}),
                       "Trainer on_evaluate")
    run.append_event(event)   # {"type": "eval", "step": 12, "metrics": {"eval_loss": 2.5}, ...}
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..schema import eval_record

__all__ = ["eval_event", "hf_metrics", "lightning_metrics", "scalar_metrics"]

# Keys of the Trainer's evaluation metrics that time the evaluation rather than judge the
# model (transformers.trainer_utils.speed_metrics: "<prefix>_runtime",
# "<prefix>_samples_per_second", "<prefix>_steps_per_second"; Trainer.evaluate adds
# "..._model_preparation_time" and "..._jit_compilation_time"), and the epoch counter.
_HF_NOT_QUALITY = ("_runtime", "_samples_per_second", "_steps_per_second",
                   "_model_preparation_time", "_jit_compilation_time")


def scalar_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite scalar values of ``metrics`` (numbers or one-element tensors) as floats."""
    out: dict[str, float] = {}
    for name, value in metrics.items():
        try:
            if hasattr(value, "numel") and value.numel() != 1:
                continue
            v = float(value.detach()) if hasattr(value, "detach") else float(value)
        except (TypeError, ValueError):
            continue
        if name and math.isfinite(v):
            out[str(name)] = v
    return out


def hf_metrics(metrics: Mapping[str, Any] | None) -> dict[str, float]:
    """The quality metrics of a Trainer evaluation (``on_evaluate``'s ``metrics``)."""
    if not metrics:
        return {}
    return {k: v for k, v in scalar_metrics(metrics).items()
            if k != "epoch" and not k.endswith(_HF_NOT_QUALITY)}


def lightning_metrics(trainer: Any) -> dict[str, float]:
    """The running evaluation loop's epoch-level metrics, read before Lightning resets
    them (at ``on_validation_end``); {} during the sanity check (module docstring)."""
    if getattr(trainer, "sanity_checking", False):
        return {}
    try:  # the evaluation loop's own results: not the training's metrics of this epoch
        own = trainer._logger_connector.metrics["callback"]
    except Exception:  # another Lightning version: its public view, all stages mixed
        own = trainer.callback_metrics
    return scalar_metrics(own)


def eval_event(step: int, metrics: Mapping[str, float], source: str) -> dict[str, Any] | None:
    """The eval event for ``metrics`` at ``step`` (None when there is nothing to record)."""
    if not metrics:
        return None
    event = eval_record(int(step), metrics)
    event["source"] = source
    return event
