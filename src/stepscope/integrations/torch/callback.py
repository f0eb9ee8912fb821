"""What the Hugging Face and Lightning callbacks share: run.json content and the session.

A framework callback sees events (step begin, forward done, before optimizer step, step
end) rather than the loop itself; the core's :class:`~stepscope.record.session.StepSession` turns
those events into one step row (``begin``, ``mark``/``lap`` per phase, ``end``). Time between
the previous step's end and this step's begin (the trainer fetching the next batches,
logging, checkpointing) is recorded as ``data_wait_s``: it is the time the model waited, of
which fetching is usually most.

Used only by :mod:`..hf` and :mod:`..lightning`; under ``stepscope run`` the callbacks stand
down and the zero-code hooks record instead (see :func:`.auto.active`).
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from ...calc import flopsrun
from ...record.recorder import Recorder
from ...record.session import StepSession
from ...rundir.store import utc_stamp
from . import fingerprint as meta
from . import layout
from .clipnorm import watch_clip_norms
from .probes import environment, memory_probe, model_fingerprint, peak_flops_for_device

__all__ = ["run_meta", "open_session", "Losses", "default_run_dir", "ClipNorms"]


def run_meta(model: Any, optimizer: Any, integration: str, extra_baseline: dict[str, Any]
             ) -> dict[str, Any]:
    """run.json content a callback can see: fingerprint, optimizer, environment, FLOPs."""
    baseline: dict[str, Any] = dict(model_fingerprint(model))
    device = None
    try:
        p = next(model.parameters())
        device = p.device
        baseline["precision"] = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(
            str(p.dtype).replace("torch.", ""), str(p.dtype))
    except StopIteration:
        pass
    if optimizer is not None:
        meta.note_optimizer(baseline, getattr(optimizer, "optimizer", optimizer))
    baseline.update({k: v for k, v in extra_baseline.items() if v is not None})
    env = environment(device)
    n = baseline.get("num_params")
    if n:  # the default convention, and the table `report --flops-convention` picks from
        lookups = layout.lookup_only_params(model)
        baseline["embedding_lookup_params"] = lookups
        table = flopsrun.by_convention(n, lookups, baseline.get("seq_len"),
                                       layout.transformer_shape(model))
        env.update({**table[flopsrun.DEFAULT], "flops_by_convention": table})
    peak, source = peak_flops_for_device(device, baseline.get("precision", "fp32"))
    if peak is not None:
        env["peak_flops_per_device"] = peak
    env["peak_flops_source"] = source
    return {"baseline": baseline, "environment": env,
            "config": {"instrumentation": integration}}


def open_session(run_dir: str, run_meta: dict[str, Any], rank: int, device: Any,
                 alerts: str | os.PathLike[str] | None = None,
                 start_step: int = 0) -> StepSession:
    """The callback's recorder and session, with the device's memory probe.

    ``start_step``: the steps this callback recorded in earlier fits into the same run, so
    that a second ``fit``/``train`` call continues the step numbering.
    """
    probe, mem_source = memory_probe(device)
    run_meta.setdefault("environment", {})["mem_source"] = mem_source
    return StepSession(Recorder(run_dir, meta=run_meta, rank=rank, alerts=alerts,
                                start_step=start_step),
                       mem_probe=probe)


class Losses:
    """The micro-batch losses of one step, read as floats, summed or averaged."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def add(self, value: Any) -> None:
        try:
            self.values.append(float(value.detach()) if hasattr(value, "detach")
                               else float(value))
        except Exception:  # measuring must never break training
            pass

    def take(self, reduce: str = "sum") -> float | None:
        """The step's loss (None when none was seen); clears for the next step."""
        vals, self.values = self.values, []
        if not vals:
            return None
        return sum(vals) if reduce == "sum" else sum(vals) / len(vals)


class ClipNorms:
    """The pre-clip gradient norms (:mod:`.clipnorm`) while a callback trains.

    Trainers clip before the callbacks' optimizer-step events, so the gradients a callback
    sees there are clipped. The functions are wrapped where torch keeps them (never on a
    user object) and :meth:`close` puts the originals back.
    """

    def __init__(self) -> None:
        self.last: Any = None
        ref = weakref.ref(self)

        def on_norm(norm: Any) -> None:
            me = ref()
            if me is not None:
                me.last = norm

        self._undo = watch_clip_norms(on_norm)

    def take(self) -> float | None:
        """The norm of the last clip since the previous take, or None (no clipping)."""
        v, self.last = self.last, None
        return None if v is None else float(v)

    def close(self) -> None:
        self._undo()


def default_run_dir(prefix: str) -> str:
    return os.path.join("runs", f"{prefix}-{utc_stamp()}")
