"""Run a training script unmodified and print, beside it, what it trained on (third-party
fixture; an observer for scripts that log too little per step to check stepscope against).

``python observe_training.py SCRIPT [ARGS...]`` runs SCRIPT as ``__main__`` with ARGS
(``runpy``, the file untouched) after registering torch's global hooks, which add nothing
to the script's objects:
- module forward hooks keep the ``.loss`` of every forward whose output has one (on real
  tensors: a forward on meta tensors is stepscope's FLOP count, not the script's): run with
  autograd on by a module in training mode, it is a micro-batch of the trained model
  (with the batch size of its ``input_ids`` keyword); otherwise an evaluation forward,
  timed from its pre-hook to its hook;
- optimizer step pre/post hooks print, for every ``torch.optim`` step that runs,
  ``SS step step=N loss=.. micro=.. losses=[..] grad_norm=.. lr=.. t=..``: the step's
  micro-batch losses and their sample-weighted mean, the global L2 norm of the gradients
  the step is about to apply (float32 norms per tensor, then their norm, as
  ``clip_grad_norm_``), group 0's learning rate and ``perf_counter`` after the step;
- ``SS eval after_step=N forwards=K start=.. end=..`` for each run of evaluation forwards
  between steps (``perf_counter`` at the first one's start and the last one's end),
  printed when training resumes or the script ends.
Floats are printed with ``repr`` (exact round trip).
"""

import atexit
import runpy
import sys
import time
import weakref
from pathlib import Path

import torch
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

_micro: list[tuple[float, int]] = []
_pending: dict[str, float] = {}
_steps = [0]
_models: weakref.WeakSet = weakref.WeakSet()  # modules whose forward returned a loss
_eval_start: dict[int, float] = {}
_evals: list[tuple[float, float]] = []  # (start, end) of evaluation forwards since a step


def _is_eval(module):
    return not module.training or not torch.is_grad_enabled()


def _flush_evals():
    if _evals:
        print(f"SS eval after_step={_steps[0]!r} forwards={len(_evals)!r} "
              f"start={_evals[0][0]!r} end={_evals[-1][1]!r}", flush=True)
        _evals.clear()


def _pre_forward(module, args):
    if module in _models and _is_eval(module):
        _eval_start[id(module)] = time.perf_counter()


def _forward(module, args, kwargs, output):
    loss = getattr(output, "loss", None)
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        return
    if loss.is_meta:  # stepscope counting FLOPs on meta tensors: not the script's forward
        _eval_start.pop(id(module), None)
        return
    _models.add(module)
    if _is_eval(module):
        start = _eval_start.pop(id(module), None)
        if start is not None:
            _evals.append((start, time.perf_counter()))
        return
    _flush_evals()
    ids = kwargs.get("input_ids")
    n = int(ids.shape[0]) if isinstance(ids, torch.Tensor) and ids.dim() > 0 else 1
    _micro.append((float(loss.detach()), n))


def _pre_step(optimizer, args, kwargs):
    norms = [p.grad.detach().norm(2) for g in optimizer.param_groups for p in g["params"]
             if p.grad is not None]
    _pending["grad_norm"] = float(torch.stack(norms).norm(2)) if norms else float("nan")


def _post_step(optimizer, args, kwargs):
    _steps[0] += 1
    losses = [x for x, _ in _micro]
    weight = sum(n for _, n in _micro)
    mean = sum(x * n for x, n in _micro) / weight if weight else float("nan")
    print(f"SS step step={_steps[0]!r} loss={mean!r} micro={len(_micro)!r} "
          f"losses={losses!r} grad_norm={_pending.get('grad_norm')!r} "
          f"lr={optimizer.param_groups[0]['lr']!r} t={time.perf_counter()!r}", flush=True)
    _micro.clear()


register_module_forward_pre_hook(_pre_forward)
register_module_forward_hook(_forward, with_kwargs=True)
register_optimizer_step_pre_hook(_pre_step)
register_optimizer_step_post_hook(_post_step)
atexit.register(_flush_evals)

script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, str(Path(script).resolve().parent))
runpy.run_path(script, run_name="__main__")
