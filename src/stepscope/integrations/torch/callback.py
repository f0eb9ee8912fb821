"""What the Hugging Face and Lightning callbacks share: phase timing fed to a Recorder.

A framework callback sees events (step begin, forward done, before optimizer step, step
end) rather than the loop itself; :class:`PhaseClock` turns those events into one step row.
Time between the previous step's end and this step's begin (the trainer fetching the
next batches, logging, checkpointing) is recorded as ``data_wait_s``: it is the time the
model waited, of which fetching is usually most.

Used only by :mod:`.hf` and :mod:`.lightning`; under ``stepscope run`` the callbacks stand
down and the zero-code hooks record instead (see :func:`.auto.active`).
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from ...recorder import Recorder

_NAN = math.nan


def run_meta(model: Any, optimizer: Any, integration: str, extra_baseline: dict[str, Any]
             ) -> dict[str, Any]:
    """run.json content a callback can see: fingerprint, optimizer, environment, 6N FLOPs."""
    from . import meta
    from .probes import environment, model_fingerprint, peak_flops_for_device

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
        holder = type("H", (), {"baseline": baseline})()
        meta.note_optimizer(holder, getattr(optimizer, "optimizer", optimizer))
    baseline.update({k: v for k, v in extra_baseline.items() if v is not None})
    env = environment(device)
    n = baseline.get("num_params")
    if n:
        env.update(meta.six_n(n))
    peak, source = peak_flops_for_device(device, baseline.get("precision", "fp32"))
    if peak is not None:
        env["peak_flops_per_device"] = peak
    env["peak_flops_source"] = source
    return {"baseline": baseline, "environment": env,
            "config": {"instrumentation": integration}}


class PhaseClock:
    """Step rows from callback events. Times are ``perf_counter`` seconds.

    Example::

        pc = PhaseClock(Recorder("runs/x"))
        pc.step_begin(); pc.forward_begin(); pc.forward_end(); pc.backward_end()
        pc.optimizer_begin(); pc.optimizer_end(); pc.step_end(lr=1e-3)
    """

    def __init__(self, rec: Recorder, device: Any = None) -> None:
        from .probes import memory_probe

        self.rec = rec
        self.t_last = time.perf_counter()
        self.t_mark = self.t_last
        self.in_step = False
        self.tokens = 0.0
        self.samples = 0.0
        self.losses: list[float] = []
        self.probe, mem_source = memory_probe(device)
        try:
            rec.run.update_meta(environment={"mem_source": mem_source})
        except Exception:  # measuring must never break training
            pass

    def step_begin(self) -> None:
        now = time.perf_counter()
        if self.in_step:
            return
        self.rec.add_time("data_wait", now - self.t_last)  # between steps: counts in this one
        self.rec.start_step()
        self.in_step = True
        self.tokens = self.samples = 0.0
        self.losses = []
        self.t_mark = now

    def batch(self, batch: Any) -> None:
        from .probes import batch_counts

        tokens, samples = batch_counts(batch)
        if not math.isnan(tokens):
            self.tokens += tokens
        if not math.isnan(samples):
            self.samples += samples

    def loss(self, value: Any) -> None:
        try:
            self.losses.append(float(value.detach()) if hasattr(value, "detach")
                               else float(value))
        except Exception:  # measuring must never break training
            pass

    def _phase(self, name: str) -> None:
        now = time.perf_counter()
        if self.in_step:
            self.rec.add_time(name, now - self.t_mark)
        self.t_mark = now

    def forward_begin(self) -> None:
        self.t_mark = time.perf_counter()

    def forward_end(self) -> None:
        self._phase("forward")

    def backward_end(self) -> None:
        self._phase("backward")

    def optimizer_begin(self) -> None:
        self.t_mark = time.perf_counter()

    def optimizer_end(self) -> None:
        self._phase("optimizer")

    def step_end(self, loss_reduce: str = "sum", **values: float | None) -> None:
        """Close the step; ``None`` values were not seen (a NaN is the training's own)."""
        if not self.in_step:
            return
        peak, alloc = self.probe()
        logged: dict[str, float | None] = {
            "tokens": self.tokens or None, "samples": self.samples or None,
            "mem_peak_bytes": peak, "mem_alloc_bytes": alloc, **values}
        if self.losses:
            logged["loss"] = sum(self.losses) if loss_reduce == "sum" else \
                sum(self.losses) / len(self.losses)
        self.rec.log(**{k: v for k, v in logged.items() if v is not None})
        self.rec.end_step()
        self.in_step = False
        self.t_last = time.perf_counter()


def default_run_dir(prefix: str) -> str:
    from ...store import utc_stamp

    return os.path.join("runs", f"{prefix}-{utc_stamp()}")
