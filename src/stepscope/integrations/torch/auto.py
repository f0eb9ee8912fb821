"""Zero-code PyTorch instrumentation: what ``stepscope run`` installs in the training process.

``stepscope run -- python train.py`` puts a ``sitecustomize`` on ``PYTHONPATH`` that calls
:func:`bootstrap`. Nothing happens until the script imports torch; then global hooks are
installed (:mod:`.hooks`) and one step row per optimizer step is written for this
rank:

* step boundary: the global optimizer step post-hook of the first optimizer that steps
  (one optimizer step = one training step, whatever the gradient accumulation); without
  any torch.optim optimizer, ``Module.zero_grad()`` after a backward (:mod:`.loops`);
* ``data_wait_s``: time blocked in ``DataLoader`` iterators' ``__next__``;
* ``forward_s``: outermost module calls with autograd enabled; ``backward_s``:
  ``Tensor.backward`` / ``torch.autograd.backward``, minus exposed communication;
  ``optimizer_s``: optimizer pre-hook to post-hook, minus a closure's own time
  (LBFGS, Lightning: :mod:`.closure`);
* ``eval_s`` / ``checkpoint_s``: no-grad / eval-mode forwards of the trained model and
  ``torch.save`` calls between steps, booked apart from the step (:mod:`.between`);
* ``comm_s`` / ``comm_exposed_s``: DDP comm hook per bucket, ``torch.distributed``
  collectives (FSDP2) — see :mod:`.ddp`;
* ``tokens`` / ``samples``: the inputs (positional or keyword) of the outermost module
  call when they hold token ids (first 2-D integer tensor, ``input_ids`` first;
  ``[seq, batch]`` when the model's recurrent / attention layers are ``batch_first=False``:
  :mod:`.layout`), else the DataLoader batches drawn during the step; summed over
  micro-batches.
  ``STEPSCOPE_TOKENS_PER_STEP`` / ``STEPSCOPE_SAMPLES_PER_STEP`` override.
* ``loss``: the scalar ``backward()`` was called on, summed over micro-batches (a script
  that divides by the accumulation count gets the mean; a partial step's sum is rescaled
  to its mean once the count is confirmed: :mod:`.accum`), unscaled when it came from
  ``GradScaler.scale``, a closure's first evaluation only; ``lr``: first param group at
  optimizer pre-hook; ``grad_norm``: ``clip_grad_norm_``'s (pre-clip) return value when
  the script clips, else computed every ``STEPSCOPE_GRAD_NORM_EVERY`` steps (after a
  closure's first evaluation); ``loss_scale``/``overflow``: GradScaler.

Switches (environment of the child; set by ``stepscope run`` or ``stepscope isolate``):

=============================  ==============================================================
``STEPSCOPE_RUN_DIR``          run directory (required; without it nothing is installed)
``STEPSCOPE_MAX_STEPS=N``      stop cleanly (``SystemExit(0)``) after N optimizer steps
``STEPSCOPE_REPLAY_DATA=1``    DataLoaders replay their first K real batches (K =
                               ``STEPSCOPE_REPLAY_BATCHES``, default 8): data cost ~0
``STEPSCOPE_NOOP_GRAD_SYNC=1`` DDP comm hook returns local gradients (not a valid run)
``STEPSCOPE_PROFILE_STEPS=a:b`` torch.profiler trace of steps a..b (both included) into
                               ``STEPSCOPE_PROFILE_DIR``
``STEPSCOPE_CROSS_RANK_EVERY`` steps between cross-rank gathers (default 20, 0 = off)
``STEPSCOPE_FLOPS_CONVENTION`` the MFU's FLOPs convention (default ``matmul``; see
                               :mod:`stepscope.calc.flopsrun`)
=============================  ==============================================================

Every hook body is wrapped: a failure inside stepscope is counted and warned about once,
never raised into training (``STEPSCOPE_MAX_STEPS`` is the one deliberate exit).

Example (what the bootstrap does)::

    from stepscope.integrations.torch import auto as torch_auto
    torch_auto.bootstrap()        # no-op unless STEPSCOPE_RUN_DIR is set
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from .._afterimport import AfterImport
from .settings import ENV_PREFIX, Settings, parse_steps

if TYPE_CHECKING:  # imported with torch, by install
    from .state import AutoState

__all__ = ["Settings", "bootstrap", "install", "active", "parse_steps", "ENV_PREFIX"]



_STATE: AutoState | None = None  # this process's state once torch is imported


def active() -> bool:
    """True inside a process instrumented by ``stepscope run`` (callbacks then stand down)."""
    return _STATE is not None or bool(os.environ.get(ENV_PREFIX + "RUN_DIR"))


def install(settings: Settings) -> AutoState:
    """Install the hooks now (torch must be importable); returns the process state."""
    global _STATE
    if _STATE is not None:
        return _STATE
    # Imported here, not at the top: every Python process of an instrumented job imports
    # this module (sitecustomize), and only those that import torch need the hooks.
    from . import hooks

    _STATE = hooks.install(settings)
    return _STATE


def _install_quietly(settings: Settings) -> None:
    """:func:`install` from the post-import hook: never break the user's ``import torch``."""
    try:
        install(settings)
    except Exception as exc:
        _warn(f"instrumentation not installed: {type(exc).__name__}: {exc}")


def _warn(message: str) -> None:
    try:
        sys.stderr.write(f"stepscope: {message}\n")
    except Exception:  # measuring must never break training
        pass


def bootstrap() -> None:
    """Entry point of the ``sitecustomize`` that ``stepscope run`` puts on PYTHONPATH."""
    settings = Settings.from_env()
    if settings is None:
        return
    if "torch" in sys.modules:
        install(settings)
        return
    # Installing eagerly would import torch into every Python process of the job (launchers,
    # MindSpore scripts): wait until the script itself imports torch.
    sys.meta_path.insert(0, AfterImport("torch", lambda: _install_quietly(settings)))

