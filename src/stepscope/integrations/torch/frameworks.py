"""What frameworks state themselves, under ``stepscope run``: evaluations, DeepSpeed's norm.

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

DeepSpeed ZeRO: the torch optimizer inside it holds this rank's flat partition, so the
norm of its gradients is one rank's share. ZeRO computes the global pre-clip norm before
it steps that optimizer (what ``engine.get_global_grad_norm()`` returns); its
``_optimizer_step`` (stages 1/2 and 3) hands that value to the step, as a script's
``clip_grad_norm_`` does.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping
from typing import Any

from .. import evals
from .clipnorm import ClipNorm
from .failures import Failures
from .firststep import PreTraining

__all__ = ["FrameworkPatches"]

# A framework's evaluation metrics and where they came from, handed to the state.
OnEval = Callable[[Mapping[str, float], str], None]


class FrameworkPatches:
    """The frameworks patched so far, and what their patches report to."""

    def __init__(self, failures: Failures, pre: PreTraining, clip: ClipNorm,
                 on_eval: OnEval) -> None:
        self.failures = failures
        self.pre = pre  # held forwards: a framework's evaluation ran them
        self.clip = clip  # DeepSpeed ZeRO's global norm
        self.on_eval = on_eval  # a framework reported an evaluation's metrics
        self.done: set[str] = set()

    def patch_loaded(self) -> None:
        """Patch the frameworks imported by now, each once per process."""
        if len(self.done) == len(_TARGETS):
            return
        for name, patch in _TARGETS.items():
            mod = sys.modules.get(name)
            if mod is None or name in self.done:
                continue
            self.done.add(name)
            try:
                patch(self, mod)
            except Exception as exc:  # another version's layout: the generic collector stays
                self.failures.failed(f"{name} evaluation hook", exc)

    def evaluated(self, metrics: Mapping[str, float], source: str) -> None:
        """A framework's evaluation loop ended with ``metrics``."""
        self.pre.framework_ran()
        self.on_eval(metrics, source)


def _patch_hf(fw: FrameworkPatches, mod: Any) -> None:
    cls = mod.CallbackHandler
    orig = cls.on_evaluate

    @functools.wraps(orig)
    def on_evaluate(self: Any, args: Any, state: object, control: Any, metrics: Any,
                    **kwargs: Any) -> Any:
        try:
            fw.evaluated(evals.hf_metrics(metrics), "Trainer on_evaluate")
        except Exception as exc:
            fw.failures.failed("Trainer on_evaluate hook", exc)
        return orig(self, args, state, control, metrics, **kwargs)

    cls.on_evaluate = on_evaluate


def _patch_lightning(fw: FrameworkPatches, mod: Any) -> None:
    cls = mod._EvaluationLoop
    orig = cls._on_evaluation_end

    @functools.wraps(orig)
    def _on_evaluation_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            fw.evaluated(evals.lightning_metrics(self.trainer), "Lightning evaluation loop")
        except Exception as exc:
            fw.failures.failed("Lightning evaluation hook", exc)
        return orig(self, *args, **kwargs)

    cls._on_evaluation_end = _on_evaluation_end


def _patch_zero(cls_name: str) -> Callable[[FrameworkPatches, Any], None]:
    def patch(fw: FrameworkPatches, mod: Any) -> None:
        cls = getattr(mod, cls_name)
        orig = cls._optimizer_step

        @functools.wraps(orig)
        def _optimizer_step(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                norm = getattr(self, "_global_grad_norm", None)
                if norm is not None:
                    fw.clip.given(norm)
            except Exception as exc:
                fw.failures.failed("DeepSpeed ZeRO hook", exc)
            return orig(self, *args, **kwargs)

        cls._optimizer_step = _optimizer_step

    return patch


_TARGETS: dict[str, Callable[[FrameworkPatches, Any], None]] = {
    "transformers.trainer_callback": _patch_hf,
    "lightning.pytorch.loops.evaluation_loop": _patch_lightning,
    "pytorch_lightning.loops.evaluation_loop": _patch_lightning,
    "deepspeed.runtime.zero.stage_1_and_2": _patch_zero("DeepSpeedZeroOptimizer"),
    "deepspeed.runtime.zero.stage3": _patch_zero("DeepSpeedZeroOptimizer_Stage3"),
}
