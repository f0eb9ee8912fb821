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
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["COLUMNS", "book", "trained", "is_eval_forward"]

# kind -> step-table column (schema.py describes both)
COLUMNS = {"eval": "eval_s", "checkpoint": "checkpoint_s"}


def trained(d: Any) -> bool:
    """The open step has done training work (a counted forward or a backward)."""
    return bool(d.fwd_calls or d.micro)


def book(d: Any, kind: str, t_end: float) -> bool:
    """Book the open step's time so far as ``kind`` and restart it at ``t_end``.

    ``d`` is the open :class:`~.values.StepData`. Returns False (nothing changed) once the
    step has done training work, or when no step is open yet (nothing to move).
    """
    if trained(d) or math.isnan(d.t_start):
        return False
    col = COLUMNS[kind]
    # stepscope's own time after the previous boundary sits inside the span: not eval
    span = max(0.0, t_end - d.t_start - d.tool)
    d.extra[col] = d.extra.get(col, 0.0) + span
    d.t_start = t_end
    d.tool = 0.0
    # fetches from an eval loader since the step opened were the evaluation's
    d.data_wait = 0.0
    d.loader_batches = 0
    d.loader_tokens = 0.0
    d.loader_samples = 0.0
    return True


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
