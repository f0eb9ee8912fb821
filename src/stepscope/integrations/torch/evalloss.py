"""Evaluation losses of ``stepscope run``: what evaluation forwards between steps computed.

While the trained model is evaluated between two optimizer steps (:mod:`.between`), each
evaluation forward's loss is kept: the output's own (a Hugging Face ``ModelOutput.loss``,
a ``{"loss": ...}`` dict, the one scalar of a tuple such as nanoGPT's and minGPT's
``(logits, loss)``, or a scalar output), else the scalar of a ``torch.nn`` loss module
called right after the forward with autograd off (pytorch/examples word_language_model's
``criterion(output, targets)``). Forwards without a loss (``generate()``) are left out.

When training resumes, the evaluation is one eval event (:mod:`..evals`): ``eval_loss`` =
the mean of its forwards' losses weighted by each forward's tokens (else its samples,
else 1). That is the value HF's Trainer, Lightning's ``self.log`` (batch-size weighted),
word_language_model (sequence-length weighted) and nanoGPT (equal batches) report for one
evaluation set. A script that evaluates several sets between two steps (nanoGPT's
``estimate_loss``: train and val) gets their mean over all forwards; accelerate's
``run_clm_no_trainer`` repeats each loss by the configured batch size, so its own value
differs from this one only when the last eval batch is partial.

Under the HF Trainer or Lightning the framework's reported metrics are recorded instead
(:mod:`.frameworks`) and this collector stands down for the rest of the run. Losses stay
device tensors until training resumes (no host synchronisation during the evaluation).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .. import evals as evals_mod

if TYPE_CHECKING:
    from ...record.recorder import Recorder

__all__ = ["EvalLosses", "forward_loss", "is_loss_module", "weight_of", "flush", "reported"]

SOURCE = "evaluation forwards between steps (mean of their losses, weighted by tokens)"


def _scalar(value: Any) -> bool:
    try:
        return bool(value.dim() == 0 and value.is_floating_point())
    except Exception:
        return False


def forward_loss(output: Any) -> Any:
    """The loss an evaluation forward returned, or None (module docstring)."""
    if _scalar(output):
        return output
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, Mapping):
        loss = output.get("loss")
    if loss is not None:
        return loss if _scalar(loss) else None
    if isinstance(output, (tuple, list)):
        scalars = [v for v in output if _scalar(v)]
        if len(scalars) == 1:
            return scalars[0]
    return None


def is_loss_module(module: Any, torch: Any) -> bool:
    return isinstance(module, torch.nn.modules.loss._Loss)


class EvalLosses:
    """The losses of the evaluation in progress: ``[loss tensor or None, weight]`` each."""

    def __init__(self) -> None:
        self.entries: list[list[Any]] = []
        self.framework = False  # the HF Trainer or Lightning reports evaluations itself
        self.events: list[dict[str, Any]] = []  # eval events waiting for the recorder

    def add(self, loss: Any, weight: float) -> list[Any] | None:
        """Keep one evaluation forward's loss (None: it had none); returns its entry."""
        if self.framework:
            return None
        entry = [None if loss is None else loss.detach(), weight]
        self.entries.append(entry)
        return entry

    def drop(self, entry: list[Any]) -> None:
        """Forget one entry (a forward found not to be an evaluation: .firststep)."""
        self.entries = [e for e in self.entries if e is not entry]

    def awaiting(self) -> bool:
        """The last evaluation forward gave no loss: a loss module may compute it next."""
        return bool(self.entries) and self.entries[-1][0] is None

    def set_last(self, loss: Any) -> None:
        if self.awaiting() and _scalar(loss):
            self.entries[-1][0] = loss.detach()

    def clear(self) -> None:
        self.entries = []

    def take(self) -> tuple[float, int] | None:
        """(weighted mean loss, forwards with a loss), None when no forward had one."""
        entries, self.entries = self.entries, []
        num = den = 0.0
        n = 0
        for loss, weight in entries:
            if loss is None:
                continue
            v = float(loss)
            if not math.isfinite(v):
                return None  # a NaN evaluation: nothing comparable to record
            num += v * weight
            den += weight
            n += 1
        return (num / den, n) if n and den > 0 else None


def weight_of(tokens: float, samples: float) -> float:
    """A forward's weight in the mean: its tokens, else its samples, else 1."""
    for v in (tokens, samples):
        if not math.isnan(v) and v > 0:
            return float(v)
    return 1.0


def flush(evals: EvalLosses, rec: Recorder | None, step: int) -> None:
    """Write the finished evaluation's events.

    Called when training resumes and at the end of the process; ``step`` is the number of
    optimizer steps recorded so far (:mod:`..evals`). Before the recorder exists (an
    evaluation before any training work) the events wait for it.
    """
    if not (evals.entries or evals.events) or rec is None:
        return
    got = evals.take()
    if got is not None:
        event = evals_mod.eval_event(step, {"eval_loss": got[0]},
                                     f"{SOURCE}; {got[1]} forwards")
        if event is not None:
            evals.events.append(event)
    events, evals.events = evals.events, []
    for event in events:
        rec.run.append_event(event)


def reported(evals: EvalLosses, metrics: Mapping[str, float], source: str,
             rec: Recorder | None, step: int) -> None:
    """A framework reported an evaluation: record its metrics, stand the collector down."""
    evals.framework = True
    evals.clear()
    event = evals_mod.eval_event(step, metrics, source)
    if event is not None:
        evals.events.append(event)
        flush(evals, rec, step)
