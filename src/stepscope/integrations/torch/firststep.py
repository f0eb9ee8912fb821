"""Forwards before the first training forward: evaluation, a probe, or part of step 0.

Before any training forward it is not known which model is trained, and a no-grad forward
then can be an evaluation (Lightning's sanity check, nanoGPT's ``estimate_loss`` at
iteration 0) or a probe (``print(model(x).shape)``, torchinfo or Lightning's
``ModelSummary`` running an example input). So each outermost no-grad / eval-mode forward
of a module with parameters is held as a :class:`Segment` and resolved at the first
training forward, when the trained model is known:

* evaluation -- it computed a loss (its output's, or a loss module's right after it:
  :mod:`.evalloss`), or a framework's evaluation loop ran it (a Lightning validation loop,
  sanity check included, or a Trainer ``evaluate()``: :mod:`.frameworks`). Booked as
  ``eval_s`` on step 0, as evaluation between steps is (:mod:`.between`);
* a probe -- a forward of the trained model with neither: not a step and not an
  evaluation. Its own time goes to run.json ``config.before_training``
  (``probe_forwards``, ``probe_s``) and is left out of step 0's time; a DataLoader fetch
  before it stays in step 0 (a probe often runs on the first batch, which is trained);
* part of step 0 -- a forward of another module (a frozen teacher or reference model on
  the first batch) stays in the step.

An evaluation's time is, as between steps, everything since the step opened or the
previous evaluation ended (its loader's fetches included), less the probes in it; when no
step was open yet (nothing of training had happened), just its forwards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .evalloss import EvalLosses
    from .pending import StepData

__all__ = ["Segment", "PreTraining"]

PROBE_NOTE = ("no-grad / eval-mode forwards of the trained model before its first training "
              "forward, with no loss and no framework evaluation around them (shape "
              "probes, model summaries): not part of step 0, not evaluation")


@dataclass
class Segment:
    key: int | None  # first-parameter id of the module
    t0: float  # the forward's start
    t_end: float  # its end
    in_step: bool  # the step was already open (its time is inside step 0's span)
    data: tuple[float, int, float, float]  # step 0's loader counters at the end
    entry: list[Any] | None  # its loss entry in the collector (.evalloss), if collected
    framework: bool = False  # a framework's evaluation loop ran it


def _kind(seg: Segment, train_key: int | None) -> str | None:
    if seg.framework or (seg.entry is not None and seg.entry[0] is not None):
        return "eval"
    return "probe" if seg.key == train_key else None


class PreTraining:
    """The forwards held before the first training forward, and the probes found so far."""

    def __init__(self) -> None:
        self.segments: list[Segment] = []
        self.probes: tuple[int, float] = (0, 0.0)  # probe forwards, their seconds

    def hold(self, d: StepData, key: int | None, t0: float, t_end: float,
             entry: list[Any] | None) -> None:
        """Keep one pre-training forward (``d``: the open step) for :meth:`resolve`."""
        self.segments.append(Segment(
            key, t0, t_end, not math.isnan(d.t_start),
            (d.data_wait, d.loader_batches, d.loader_tokens, d.loader_samples), entry))

    def framework_ran(self) -> None:
        """A framework's evaluation loop ended: the forwards held so far were evaluation."""
        for seg in self.segments:
            seg.framework = True

    def resolve(self, d: StepData, evals: EvalLosses, train_key: int | None
                ) -> dict[str, Any] | None:
        """The first training forward of step ``d`` starts: book the held forwards
        (module docstring). Returns run.json ``config.before_training`` when probes were
        found, else None."""
        segs, self.segments = self.segments, []
        start, shift, cut = d.t_start, 0.0, None
        note = None
        for seg in segs:
            kind = _kind(seg, train_key)
            if kind != "eval" and seg.entry is not None:
                evals.drop(seg.entry)  # not an evaluation: no loss of it is recorded
            if kind == "eval":
                # everything since the step opened or the last evaluation, less the probes'
                span = seg.t_end - start - shift if seg.in_step else seg.t_end - seg.t0
                d.extra["eval_s"] = d.extra.get("eval_s", 0.0) + max(0.0, span)
                if seg.in_step:
                    start, shift, cut = seg.t_end, 0.0, seg
            elif kind == "probe":
                span = max(0.0, seg.t_end - seg.t0)  # the forward alone: a fetch before it
                if seg.in_step:                        # may be the first step's own batch
                    shift += span
                n, total = self.probes
                self.probes = (n + 1, total + span)
                note = {"probe_forwards": n + 1, "probe_s": total + span, "note": PROBE_NOTE}
        if not math.isnan(start):
            d.t_start = start + shift  # step 0's span without the booked forwards
        if cut is not None:  # ... and without the fetches of the evaluation
            wait, batches, tokens, samples = cut.data
            d.data_wait = max(0.0, d.data_wait - wait)
            d.loader_batches = max(0, d.loader_batches - batches)
            d.loader_tokens = max(0.0, d.loader_tokens - tokens)
            d.loader_samples = max(0.0, d.loader_samples - samples)
        return note
