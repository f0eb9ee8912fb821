"""HF Trainer and Lightning evaluations under ``stepscope run``: the framework's own metrics.

Their evaluation losses are the framework's to state (Lightning computes ``val_loss`` in
``validation_step``, out of sight of module hooks; the Trainer averages its own way), so
the zero-code path records what the framework reports at the end of each evaluation, the
same values its callbacks see (:mod:`..evals`), and the generic forward-loss collector
(:mod:`.evalloss`) stands down. Patched on the framework's classes once they are
imported (checked when a model is first trained and when an evaluation forward starts),
never on the user's objects:

* ``transformers.trainer_callback.CallbackHandler.on_evaluate`` (the Trainer's metrics);
* ``lightning.pytorch`` / ``pytorch_lightning`` ``_EvaluationLoop._on_evaluation_end``
  (where ``on_validation_end`` callbacks run, before the loop resets its results).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from .. import evals
from . import evalloss, firststep

__all__ = ["patch_loaded"]


def _patch_hf(st: Any, mod: Any) -> None:
    cls = mod.CallbackHandler
    orig = cls.on_evaluate

    @functools.wraps(orig)
    def on_evaluate(self: Any, args: Any, state: Any, control: Any, metrics: Any,
                    **kwargs: Any) -> Any:
        try:
            firststep.framework_ran(st)
            evalloss.reported(st, evals.hf_metrics(metrics), "Trainer on_evaluate")
        except Exception as exc:
            st.failed("Trainer on_evaluate hook", exc)
        return orig(self, args, state, control, metrics, **kwargs)

    cls.on_evaluate = on_evaluate


def _patch_lightning(st: Any, mod: Any) -> None:
    cls = mod._EvaluationLoop
    orig = cls._on_evaluation_end

    @functools.wraps(orig)
    def _on_evaluation_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            firststep.framework_ran(st)
            evalloss.reported(st, evals.lightning_metrics(self.trainer),
                              "Lightning evaluation loop")
        except Exception as exc:
            st.failed("Lightning evaluation hook", exc)
        return orig(self, *args, **kwargs)

    cls._on_evaluation_end = _on_evaluation_end


_TARGETS: dict[str, Callable[[Any, Any], None]] = {
    "transformers.trainer_callback": _patch_hf,
    "lightning.pytorch.loops.evaluation_loop": _patch_lightning,
    "pytorch_lightning.loops.evaluation_loop": _patch_lightning,
}


def patch_loaded(st: Any) -> None:
    """Patch the frameworks imported by now, each once per process."""
    if len(st.frameworks_patched) == len(_TARGETS):
        return
    for name, patch in _TARGETS.items():
        mod = sys.modules.get(name)
        if mod is None or name in st.frameworks_patched:
            continue
        st.frameworks_patched.add(name)
        try:
            patch(st, mod)
        except Exception as exc:  # another version's layout: the generic collector stays
            st.failed(f"{name} evaluation hook", exc)
