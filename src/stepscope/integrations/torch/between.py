"""Work between optimizer steps that is not training: evaluation and checkpoint saves.

A step opens at the previous step's boundary, so evaluation between steps (nanoGPT's
``estimate_loss``, minGPT's ``generate()``, a Trainer's or Lightning's validation loop with
its own DataLoader) and checkpoint saves would be folded into the next step: read as a
stall, its eval-loader fetches as data wait. Here, while a step has seen no training work
yet (no grad-enabled forward of a model with parameters, no backward), each such activity
books everything since the step opened -- the activity and the gap before it (eval-loader
fetches, metric computation, ``state_dict()`` copies) -- as ``eval_s`` or ``checkpoint_s``,
and the step restarts at the activity's end. Step-time statistics therefore leave it out,
and the stall rule does not count it.

What counts as evaluation: the outermost forward call, with autograd disabled or the module
in eval mode, of a module sharing its first parameter with a module that was trained
(a teacher or reference model of the step does not qualify, and once training work began,
a no-grad forward belongs to the step). Before the first training forward, the trained
model is not known yet: such forwards are held and then told apart into evaluation,
probes and step 0's own work (:mod:`.firststep`). A checkpoint: a ``torch.save`` call.

Not every no-grad forward between steps is evaluation, though: forwards of the trained
model with no loss and no framework evaluation loop around them, before each of
:data:`RECUR` steps in a row (an RL rollout, a probe or sampling on every step), are the
loop's own work. From the step that completes such a run on, :func:`settle` gives their
time back to the step when its first training forward starts; run.json
``config.between_steps`` says from which step. A loss (or a framework) makes them
evaluation again, and a step without them resets the count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .pending import BETWEEN_COLUMNS, StepData

if TYPE_CHECKING:
    from .evalloss import EvalLosses

__all__ = ["RECUR", "LosslessRun", "book", "attach", "settle", "trained",
           "is_eval_forward"]

# steps in a row with lossless forwards between them: from then on, the step's own work
RECUR = 3
RECUR_NOTE = ("no-grad forwards of the trained model with no loss and no framework "
              f"evaluation ran before each of {RECUR} steps in a row (a rollout, probe or "
              "sample every step): from this step on they count in the step, not as eval")


def trained(d: StepData) -> bool:
    """The open step has done training work (a counted forward or a backward)."""
    return bool(d.fwd_calls or d.micro)


def book(d: StepData, kind: str, t_end: float) -> bool:
    """Book the open step's time so far as ``kind`` and restart it at ``t_end``.

    ``d`` is the open step. Returns False (nothing changed) once the step has done
    training work, or when no step is open yet (nothing to move).
    """
    if trained(d) or math.isnan(d.t_start):
        return False
    col = BETWEEN_COLUMNS[kind]
    # stepscope's own time after the previous boundary sits inside the span: not eval
    span = max(0.0, t_end - d.t_start - d.tool)
    # what this booking takes from the step, in case :func:`settle` gives it back
    d.booked.append([kind, span, d.tool, d.data_wait, d.loader_batches, d.loader_tokens,
                     d.loader_samples, None])
    d.extra[col] = d.extra.get(col, 0.0) + span
    d.t_start = t_end
    d.tool = 0.0
    # fetches from an eval loader since the step opened were the evaluation's
    d.data_wait = 0.0
    d.loader_batches = 0
    d.loader_tokens = 0.0
    d.loader_samples = 0.0
    return True


def attach(d: StepData, entry: list[Any] | None) -> None:
    """The last booking's evaluation-loss entry (:mod:`.evalloss`; its loss may be set
    later, by a loss module called right after the forward)."""
    if d.booked:
        d.booked[-1][7] = entry


@dataclass
class LosslessRun:
    """Steps in a row with lossless between-steps forwards before them."""

    steps: int = 0

    def count(self, lossless: bool) -> bool:
        """One more step (``lossless``: such forwards ran before it); True once they
        recur (:data:`RECUR` steps in a row)."""
        self.steps = self.steps + 1 if lossless else 0
        return self.steps >= RECUR


def settle(d: StepData, evals: EvalLosses, run: LosslessRun, step: int
           ) -> dict[str, Any] | None:
    """Step ``d``'s first training forward starts: count its lossless between-steps
    forwards, and once they recur (module docstring) give their time back to the step.

    ``evals``: the loss collector (``framework`` set means a framework reports
    evaluations); ``step``: the open step's index. Returns run.json
    ``config.between_steps`` when the forwards were given back, else None.
    """
    segs, d.booked = d.booked, []
    lossless = [s for s in segs if s[0] == "eval" and not evals.framework
                and s[7] is not None and s[7][0] is None]
    if not run.count(bool(lossless)):
        return None
    for _kind, span, tool, wait, batches, tokens, samples, entry in lossless:
        d.t_start -= span + tool
        d.tool += tool
        d.data_wait += wait
        d.loader_batches += batches
        d.loader_tokens += tokens
        d.loader_samples += samples
        evals.drop(entry)
    kept = [s[1] for s in segs if s[0] == "eval" and not any(s is x for x in lossless)]
    if kept:
        d.extra["eval_s"] = sum(kept)
    else:
        d.extra.pop("eval_s", None)
    return {"from_step": step, "note": RECUR_NOTE}


def first_param_id(module: Any) -> int | None:
    for p in module.parameters():
        return id(p)
    return None


def is_eval_forward(module: Any, train_params: set[int], before_training: bool) -> bool:
    """An outermost uncounted forward call of ``module`` is evaluation (module docstring);
    before training, any module with parameters is a candidate (:mod:`.firststep`)."""
    key = first_param_id(module)
    if key is None:
        return False
    return key in train_params or before_training
