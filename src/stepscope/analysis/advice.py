"""The optimization advisor: findings -> concrete, framework-specific changes.

Order follows the field report's payoff order (../shared/FIELD-REPORT.md, "Optimization
order"): parallel layout -> communication -> memory -> precision. Two stages come before
it: *correctness* (a NaN or a restarted LR makes every speed number moot) and *data* (the
report's own investigation fixed the starving pipeline first: while devices wait for data,
every other share is distorted). Each change names the knob, its expected effect and, where
it can hurt convergence, a caution (raising the global batch without scaling LR/warmup
flattens the loss curve: the report's 1024 -> 4096 story).

Example::

    for a in advise(diagnosis.findings, meta):
        print(a.stage, a.knob, "->", a.change, "|", a.expected_effect)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..calc.memory import estimate_memory
from ..findings import Finding
from ..schema import RunMeta

__all__ = ["Advice", "STAGES", "advise"]

STAGES: tuple[str, ...] = ("correctness", "data", "parallel_layout", "communication",
                           "memory", "precision")

_BATCH_CAUTION = ("raises the global batch: scale the LR (linear or sqrt rule) and warmup "
                  "with it and check the quality ledger, or the loss curve flattens "
                  "(field report: 1024 -> 4096 without LR change)")


@dataclass(frozen=True)
class Advice:
    category: str         # the finding category it answers
    stage: str            # one of STAGES (payoff order)
    framework: str        # "torch" | "mindspore"
    knob: str             # what to change, by its API name
    change: str           # the change, concretely
    expected_effect: str
    caution: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_T = "torch"
_M = "mindspore"
# (category, framework) -> [(stage, knob, change, expected effect, caution)]
_TABLE: dict[tuple[str, str], list[tuple[str, str, str, str, str | None]]] = {
    ("data_pipeline", _T): [
        ("data", "DataLoader(num_workers=, pin_memory=True, prefetch_factor=, "
         "persistent_workers=True)", "move loading and tokenization into 4-8 workers per "
         "rank with prefetch 2-4, pinned memory, workers kept alive between epochs",
         "data wait towards 0; field report: 10% -> 3%, 800 -> 1120 tokens/s", None),
        ("data", "tokenization cache", "tokenize once offline (or cache to local disk) "
         "instead of in the training process", "removes per-step CPU work on every rank",
         None),
    ],
    ("data_pipeline", _M): [
        ("data", "dataset.map(num_parallel_workers=)", "parallel map workers for decoding "
         "and tokenization", "data wait towards 0 (field report: 10% -> 3%)", None),
        ("data", "ds.config.set_prefetch_size / dataset.cache()", "a prefetch queue that "
         "overlaps backward, and a local cache of tokenized results",
         "device never idles on the data queue", None),
    ],
    ("communication", _T): [
        ("parallel_layout", "parallel layout", "stay data parallel while the model fits; "
         "add pipeline stages before tensor parallel (less communication)",
         "fewer communication-heavy dimensions", None),
        ("communication", "DDP(bucket_cap_mb=, gradient_as_bucket_view=True, "
         "static_graph=True)", "larger buckets (25 -> 100+ MB) so all-reduce overlaps "
         "backward instead of stopping per block", "exposed comm down (field report: "
         "35% -> 15%, 800 -> 1800 tokens/s)", None),
        ("communication", "model.no_sync() with gradient accumulation", "synchronise "
         "once per accumulation window", "comm per sample divided by the accumulation "
         "count", _BATCH_CAUTION),
        ("communication", "FSDP / ZeRO (fully_shard, DeepSpeed stage 1-2)",
         "reduce-scatter + all-gather instead of a full all-reduce, optimizer states "
         "sharded", "less traffic per rank and less memory", None),
    ],
    ("communication", _M): [
        ("parallel_layout", "set_auto_parallel_context(parallel_mode=, pipeline_stages=)",
         "data parallel while the model fits; pipeline stages before operator (tensor) "
         "parallel", "fewer communication-heavy dimensions", None),
        ("communication", "set_auto_parallel_context(all_reduce_fusion_config=[...])",
         "gradient fusion into fewer, larger all-reduces that overlap backward",
         "exposed comm down (field report: 35% -> 15%)", None),
        ("communication", "set_auto_parallel_context(enable_parallel_optimizer=True)",
         "optimizer-state sharding (reduce-scatter + all-gather)", "less traffic and "
         "memory per device", None),
        ("communication", "gradient accumulation", "synchronise once per accumulation "
         "window", "comm per sample divided by the accumulation count", _BATCH_CAUTION),
    ],
    ("memory", _T): [
        ("memory", "torch.utils.checkpoint on selected blocks", "selective activation "
         "checkpointing of the most memory-hungry blocks, not the whole network",
         "their activations freed for one extra forward of them (Korthikanti et al. 2022: "
         "selective recompute ~+3% FLOPs vs ~+30% for full)", None),
        ("memory", "smaller micro-batch + gradient accumulation", "halve the micro-batch, "
         "double accumulation (same global batch)", "activation memory halves; watch "
         "BatchNorm statistics and the loss scale", None),
        ("memory", "FSDP / ZeRO stage", "shard optimizer states (1), gradients (2), "
         "parameters (3)", "model-state memory divided by the DP degree per sharded "
         "part", None),
    ],
    ("memory", _M): [
        ("memory", "cell.recompute()", "recompute the most memory-hungry cells only",
         "activation memory down at extra compute on those cells", None),
        ("memory", "set_auto_parallel_context(enable_parallel_optimizer=True)",
         "optimizer-state sharding", "optimizer memory divided by the DP degree", None),
    ],
    ("numerics", _T): [
        ("precision", "torch.autocast(dtype=torch.bfloat16)", "bf16 instead of fp16 where "
         "the hardware supports it", "no overflow, no loss scale to tune", None),
        ("correctness", "torch.autograd.set_detect_anomaly(True) around the failing step",
         "find the first op producing NaN", "names the layer to fix", None),
    ],
    ("numerics", _M): [
        ("precision", "amp level / bf16", "bf16 where supported", "no overflow", None),
    ],
    ("loss_scale", _T): [
        ("precision", "GradScaler(init_scale=, growth_interval=, backoff_factor=)",
         "keep the dynamic range wide, log the scale; prefer bf16", "no collapse to "
         "underflow (field report: NaN after 500 steps)", None),
    ],
    ("loss_scale", _M): [
        ("precision", "DynamicLossScaleManager(init_loss_scale=, scale_factor=, "
         "scale_window=)", "wide range with its min/max exposed; prefer bf16",
         "no collapse to underflow (field report: NaN after 500 steps)", None),
    ],
    ("straggler", _T): [
        ("parallel_layout", "the slow rank's host", "check the slow rank (other jobs, "
         "thermal throttling, slower link, uneven shard); exclude or replace the node",
         "every rank stops waiting for it", None),
    ],
    ("lr_schedule", _T): [
        ("correctness", "LR scheduler", "create it once; save/restore scheduler.state_dict()"
         " with the optimizer", "the configured schedule, no silent restart", None),
    ],
    ("lr_schedule", _M): [
        ("correctness", "dynamic LR (nn.learning_rate_schedule)", "check the global step "
         "the schedule reads under the parallel config", "the configured schedule", None),
    ],
}


def _framework(meta: RunMeta | None, framework: str | None) -> str:
    f = framework or (str(meta.environment.get("framework", "")) if meta else "")
    return _M if f.lower().startswith("mindspore") else _T


def _memory_note(meta: RunMeta | None) -> str | None:
    base = meta.baseline if meta else {}
    n = base.get("num_params")
    if not isinstance(n, (int, float)) or n <= 0:
        return None
    dp = int(base.get("dp") or base.get("num_devices") or 1)
    z0, z3 = (estimate_memory(num_params=n, dp=dp, zero_stage=z).model_states_bytes
              for z in (0, 3))
    return (f"model states ~{z0 / 2**30:.1f} GiB/device unsharded vs ~{z3 / 2**30:.1f} GiB "
            f"with ZeRO-3 over dp={dp} (stepscope.calc.memory)")


def advise(findings: Sequence[Finding], meta: RunMeta | None = None,
           framework: str | None = None) -> list[Advice]:
    """Changes answering the warning/critical findings, in payoff order (see module doc)."""
    fw = _framework(meta, framework)
    out: list[Advice] = []
    seen: set[str] = set()
    for f in findings:
        if f.severity == "info":
            continue
        for stage, knob, change, effect, caution in _TABLE.get((f.category, fw), []):
            if knob in seen:
                continue
            seen.add(knob)
            if f.category == "memory" and "ZeRO" in knob:
                note = _memory_note(meta)
                effect = f"{effect}; {note}" if note else effect
            out.append(Advice(f.category, stage, fw, knob, change, effect, caution))
    out.sort(key=lambda a: STAGES.index(a.stage))
    return out
