"""Batch counting of the zero-code instrumentation: tokens and samples of each step.

Two sources per step (:func:`.pending.emit` picks one): the DataLoader batches drawn
during the step, and the inputs of the model's outermost calls when they hold token ids
(positional, or keywords read from the caller's frame: ``model(**batch)``). A model whose
recurrent or attention layers are ``batch_first=False`` takes ``[seq, batch]`` inputs:
its samples are the second dimension. The first batch's shapes go to run.json's baseline.

Example::

    counter = BatchCounter(torch)
    counter.loader_batch(step, batch, seconds=0.02, baseline=baseline)
    counter.model_inputs(step, (input_ids,), baseline)   # step.fwd_tokens += B * T
"""

from __future__ import annotations

import math
from typing import Any

from .pending import StepData
from .probes import batch_counts
from .readers import shape_of

__all__ = ["BatchCounter"]


class BatchCounter:
    """What the step's batches held; whether a DataLoader ran at all."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.saw_loader = False  # a DataLoader was iterated (else data wait is unknown)
        self.counted = False  # the last outermost call's positional inputs held token ids
        self.seq_first: str | None = None  # the model's [seq, batch] layer, if any

    def sequence_first(self, layer: str | None) -> None:
        self.seq_first = layer

    def loader_batch(self, d: StepData, batch: Any, seconds: float,
                     baseline: dict[str, Any]) -> None:
        """One DataLoader fetch of ``seconds`` during step ``d``."""
        self.saw_loader = True
        d.data_wait += seconds
        d.loader_batches += 1
        tokens, samples = batch_counts(batch)
        if not math.isnan(tokens):
            d.loader_tokens += tokens
        if not math.isnan(samples):
            d.loader_samples += samples
        if "batch_shape" not in baseline:
            baseline["batch_shape"] = shape_of(batch, self.torch)
            if not math.isnan(samples):
                baseline.setdefault("micro_batch", int(samples))
            if not math.isnan(tokens) and samples:
                baseline.setdefault("seq_len", int(tokens // samples))

    def model_inputs(self, d: StepData, inputs: Any, baseline: dict[str, Any]) -> None:
        """The inputs of an outermost call of the trained model, counted when they hold
        token ids (``counted`` says whether they did)."""
        tokens, samples = batch_counts(inputs)
        self.counted = not math.isnan(tokens)
        if self.counted and self.seq_first and samples:
            samples = tokens / samples  # [seq, batch]: the leading dimension is seq
        if self.counted:  # token ids seen: count them and their samples
            d.fwd_tokens += tokens
            d.fwd_samples += samples
            d.fwd_counted += 1
            if "model_input_shape" not in baseline:
                baseline["model_input_shape"] = shape_of(inputs, self.torch)
                baseline["micro_batch"] = int(samples)
                baseline["seq_len"] = int(tokens // samples)
