"""What the zero-code instrumentation does besides timing: run.json, cross-rank, profiler.

* The baseline fingerprint the process can see (model, batch shape, optimizer
  hyper-parameters, precision, seed, world size, framework versions, git commit) is
  written to run.json by rank 0 after the first step.
* Every ``STEPSCOPE_CROSS_RANK_EVERY`` steps the ranks exchange medians
  through the core session's window (:meth:`~stepscope.record.session.StepSession.cross_rank`,
  published in the run directory, not a collective); rank 0 appends a ``cross_rank``
  event to events.jsonl and every rank logs its straggler score on the step.
* ``STEPSCOPE_PROFILE_STEPS`` drives a ``torch.profiler`` capture (:mod:`.profiling`);
  ``STEPSCOPE_MAX_STEPS`` stops the script.
* At exit, what was expected but never seen (no optimizer step, no loss, no DataLoader)
  is written to run.json and as ``logging`` findings, so an empty curve is explained.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import zlib
from typing import TYPE_CHECKING, Any

from ...calc import flopsrun
from ...errors import ConfigError
from ...findings import Finding
from . import ddp, flopcount
from .probes import environment, peak_flops_for_device

if TYPE_CHECKING:  # the process state calls these plug-ins with itself (.hooks plugs them)
    from .state import AutoState
from .fingerprint import _SEED


def _dist(torch: Any) -> Any:
    d = torch.distributed
    return d if d.is_available() and d.is_initialized() else None


def note_model(st: AutoState, module: Any) -> None:
    """First outermost module with parameters: fingerprint, device, memory probe; the
    phase clock and the communication timer mark on CUDA when the model is there."""
    cuda = st.fp.note_model(st.torch, module)
    if cuda is not None:
        st.phase.on_device(cuda)
        st.comm.cuda = cuda


def _write_baseline(st: AutoState) -> None:
    """Rank 0, after the first step: the fingerprint into run.json."""
    torch = st.torch
    dist = _dist(torch)
    world = dist.get_world_size() if dist is not None else 1
    b = dict(st.fp.baseline)
    b["num_devices"] = world
    b["device_kind"] = "cpu" if st.fp.device is None or st.fp.device.type == "cpu" else \
        torch.cuda.get_device_name(st.fp.device)
    if world > 1:
        b.setdefault("parallel_strategy", "data_parallel")
        b["dp"] = world
    scaler = st.accum.scaler
    scaling = scaler is not None and scaler.is_enabled()  # nanoGPT's fp32: disabled
    b["precision"] = st.fp.precision() + (" (GradScaler)" if scaling else "")
    first = st.fp.first_micro
    if first:
        b["grad_accum"] = first
        if "micro_batch" in b:
            b["global_batch"] = b["micro_batch"] * first * world
    if _SEED:
        b["seed"] = _SEED[-1]
    env = environment(st.fp.device, code_path=_script_dir())
    n = b.get("num_params")
    if n:
        env.update(_flops_fields(st, b, n))
    peak, source = peak_flops_for_device(st.fp.device, st.fp.precision().split("-")[0])
    if peak is not None:
        env["peak_flops_per_device"] = peak
    env["peak_flops_source"] = source
    env["mem_source"] = st.fp.config.get("mem_source", "")
    config = dict(st.fp.config)
    config["world_size"] = world
    if st.rec is not None:
        st.rec.run.update_meta(baseline=b, environment=env, config=config)


def _flops_fields(st: AutoState, b: dict[str, Any], num_params: int) -> dict[str, Any]:
    """run.json FLOPs fields: the chosen convention's, and the table of every convention
    computable for this model (``report --flops-convention NAME`` picks from it)."""
    table = flopsrun.by_convention(num_params, int(b.get("embedding_lookup_params", 0)),
                                   b.get("seq_len"), b.get("model_shape"))
    counted = _counted(st, b)
    if counted:
        table[flopcount.CONVENTION] = counted
    # Token ids seen: the transformer conventions (6N default). None seen (images, feature
    # vectors): 6N per token means nothing, the network's counted FLOPs per sample do.
    tokens_seen = "seq_len" in b and "model_input_shape" in b
    default = flopsrun.DEFAULT if tokens_seen or not counted else flopcount.CONVENTION
    name = st.settings.flops_convention or default
    try:
        chosen = flopsrun.choose(table, name)
    except ConfigError as exc:
        st.fp.notes["flops_convention"] = str(exc)
        chosen = table[flopsrun.DEFAULT]
    return {**chosen, "flops_by_convention": table}


def _counted(st: AutoState, b: dict[str, Any]) -> dict[str, Any] | None:
    """The ``counted`` convention's fields from the first forward call (see flopcount)."""
    if st.fp.flop_call is None:
        return None
    model, args, kwargs = st.fp.flop_call
    st.fp.flop_call = None  # counted once; the meta copies are dropped
    st.phase.stand_by(True)  # the count's forward is not the script's: no eval, no step
    try:
        fwd, why = flopcount.forward_flops(model, args, kwargs)
    finally:
        st.phase.stand_by(False)
    if fwd is None:
        st.fp.notes["flops_counted"] = why
        return None
    samples = b.get("micro_batch") or _leading_dim(args)
    tokens = samples * b["seq_len"] if samples and "seq_len" in b and \
        "model_input_shape" in b else None
    return flopcount.counted_fields(fwd, samples, tokens,
                                    masked=why.endswith(flopcount.MASK_SUFFIX))


def _leading_dim(args: Any) -> int | None:
    """The first dimension of the first tensor argument (the batch of an image model)."""
    for a in args:
        shape = getattr(a, "shape", None)
        if shape is not None and len(shape):
            return int(shape[0])
    return None


def _script_dir() -> str:
    path = sys.argv[0] if sys.argv and sys.argv[0] else "."
    return os.path.dirname(os.path.abspath(path)) or "."


def after_boundary(st: AutoState) -> None:
    """Once-per-step work after a row was queued (each part guarded on its own)."""
    n = st.step.index  # steps completed so far
    if n == 1 and st.rank == 0:
        try:
            _write_baseline(st)
        except Exception as exc:
            st.failures.failed("baseline fingerprint", exc)
        # The one-off run.json write (it runs `git`) is not billed to step 1; the
        # per-step work stays in the steps, as it does in the script's own timestamps.
        st.step.cur.t_start = st.clock()
    if st.settings.cross_rank_every and n == 1:
        try:
            _start_cross_rank(st)
        except Exception as exc:
            st.failures.failed("cross-rank set-up", exc)
    try:
        st.profile.step(n, st.rank)
    except Exception as exc:
        st.failures.failed("profiler", exc)
    if st.settings.max_steps and n >= st.settings.max_steps:
        st.close("finished", None)
        if st.rank == 0:
            _note_config(st, {"stopped_by": f"STEPSCOPE_MAX_STEPS={st.settings.max_steps}"})
        raise SystemExit(0)


def _note_config(st: AutoState, config: dict[str, Any]) -> None:
    try:
        if st.rec is not None:
            st.rec.run.update_meta(config=config)
    except Exception as exc:
        st.failures.failed("run.json update", exc)


def _start_cross_rank(st: AutoState) -> None:
    """After the first step: compare ranks when there are ranks to compare."""
    dist = _dist(st.torch)
    if dist is None or dist.get_world_size() < 2 or st.session is None:
        return
    host = float(zlib.crc32(socket.gethostname().encode()))
    every = st.settings.cross_rank_every

    def vector(medians: list[float]) -> list[float]:
        comm = st.pending.last_comm
        # Bucket wall marks are host readings; on CUDA they are launch/callback times, not
        # device times, so the wait/transfer split is not attempted there.
        launch = comm.bucket_launch_wall if comm is not None and not st.phase.cuda else []
        done = comm.bucket_done_wall if comm is not None and not st.phase.cuda else []
        return ddp.cross_vector(medians, launch, done, host)

    # Published through the run directory, never a collective: ranks with uneven inputs
    # (model.join(), an early break) run different step counts and must never wait here.
    st.session.enable_cross_rank(vector, world=dist.get_world_size(), every=every,
                                 names=ddp.CROSS_FIELDS, window=every,
                                 event=ddp.cross_rank_summary,
                                 aligned_only=ddp.ALIGNED_ONLY)
    st.flush(block=True)  # the first row (already emitted on CPU) joins the window


def maybe_cross_rank(st: AutoState) -> None:
    """Called in the primary optimizer's pre-hook: gather every N completed steps.

    Inside the step (before ``optimizer.step``) rather than between steps, so that the
    time spent in the gather — mostly the faster ranks waiting for the slowest, which
    they would otherwise wait for in the next all-reduce — stays in a step, and in the
    same step the script's own timestamps put it in.
    """
    s = st.session
    if s is None or s.cross is None or not s.cross.due(st.step.index):
        return
    t0 = st.clock()
    try:
        st.flush(block=True)  # every completed step (one behind on CUDA) in the window
        s.cross_rank()
    except Exception as exc:
        st.failures.failed("cross-rank gather", exc)
    st.step.cur.tool += st.clock() - t0


def write_summary(st: AutoState, status: str, error: str | None) -> None:
    """At exit: what was seen, what was missing (as findings), crash events per rank."""
    if st.rec is None:
        return
    run = st.rec.run
    missing = _missing(st)
    if status == "failed":  # every rank: `stepscope run` names the first to fail
        run.append_event({"type": "crash", "rank": st.rank, "error": error,
                          "wall_time_s": time.time(), "step": st.step.index})
    if st.rank != 0:
        return
    for f in missing:
        run.append_event({"type": "finding", **f.to_dict()})
    noop = st.settings.noop_grad_sync
    config: dict[str, Any] = {
        "steps_recorded": st.step.index, "hook_failures": st.failures.count,
        "missing": [f.message for f in missing], "finished_utc": time.time(),
    }
    if noop:
        config["valid_training_run"] = False
        config["modified_by"] = "STEPSCOPE_NOOP_GRAD_SYNC=1 (gradients not synchronised)"
    if st.settings.replay_data:
        config["modified_by_data"] = "STEPSCOPE_REPLAY_DATA=1 (first batches replayed)"
    for key in ("loss_convention", "step_boundary", "before_training", "between_steps"):
        if key in st.fp.config:
            config[key] = st.fp.config[key]
    if "flops_convention" in st.fp.notes:
        config["flops_convention_refused"] = st.fp.notes["flops_convention"]
    if "flops_counted" in st.fp.notes:
        config["flops_counted"] = st.fp.notes["flops_counted"]
    try:
        run.update_meta(config=config)
    except Exception as exc:
        st.failures.failed("run.json summary", exc)


def _missing(st: AutoState) -> list[Finding]:
    out: list[Finding] = []

    def miss(what: str, why: str) -> None:
        out.append(Finding("logging", "warning", f"no {what} recorded: {why}",
                           rule="integrations.torch.auto", rank=st.rank))

    if st.step.index == 0:
        miss("steps", "no torch.optim optimizer step was seen (custom update without "
             "optimizer.step()?); use stepscope.Recorder in the script")
        return out
    if st.fp.first_micro == 0:
        miss("loss", "backward() was never called on a tensor (closure or custom autograd?)")
    if not st.batches.saw_loader:
        miss("data wait", "no torch.utils.data.DataLoader was iterated; data_wait_s is "
             "absent and tokens come from the model's inputs")
    return out
