"""The run's fingerprint as the zero-code instrumentation sees it: the baseline variables
(model, optimizer hyper-parameters, precision, seed, parallel strategy) and the config
notes other parts of the adapter hand in, kept by :class:`Fingerprint`. What is written
from it, and when, is :mod:`.run_notes`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .probes import MemProbe, memory_probe, model_fingerprint

# Optimizer hyper-parameters copied into run.json (plain numbers/bools/tuples only).
_OPT_KEYS = ("lr", "betas", "momentum", "eps", "weight_decay", "nesterov", "amsgrad",
             "dampening", "fused", "foreach")


_SEED: list[int] = []  # set by the torch.manual_seed wrapper (see .hooks)


@dataclass
class Fingerprint:
    """What run.json says of the run besides its steps: the baseline fingerprint, the
    config notes other parts hand in (loss convention, step boundary, ...), and the
    device, memory probe and first forward the fingerprint is taken from."""

    baseline: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)  # why a FLOPs figure is missing
    device: Any = None
    mem_probe: MemProbe | None = None
    flop_call: Any = None  # (model, meta args, meta kwargs) of the first forward
    first_micro: int = 0  # micro-batches of step 0 (the run's accumulation)

    def note(self, key: str, value: Any) -> None:
        """run.json ``config[key]``; the latest value stands."""
        self.config[key] = value

    def note_once(self, key: str, value: Any) -> None:
        """run.json ``config[key]`` unless already noted."""
        self.config.setdefault(key, value)

    def describe_once(self, key: str, value: Any) -> None:
        """The baseline's ``key`` unless already known."""
        self.baseline.setdefault(key, value)

    def note_model(self, torch: Any, module: Any) -> bool | None:
        """The trained model's fingerprint, device and memory probe; whether its
        parameters are on CUDA (None: it has none)."""
        inner = getattr(module, "module", module)  # DDP wraps the model in .module
        cuda = None
        try:
            p = next(module.parameters())
            self.device = p.device
            cuda = p.device.type == "cuda"
            self.baseline["param_dtype"] = str(p.dtype).replace("torch.", "")
        except StopIteration:
            pass
        self.mem_probe, self.config["mem_source"] = memory_probe(self.device)
        self.baseline.update(model_fingerprint(inner))
        self.baseline["model_name"] = type(inner).__name__
        strategy = type(module).__name__
        if strategy == "DistributedDataParallel":
            self.baseline["parallel_strategy"] = "ddp"
        elif any(type(m).__name__.startswith("FSDP") for m in module.modules()):
            self.baseline["parallel_strategy"] = "fsdp"
        autocast = [dt for dev in ("cuda", "cpu") if torch.is_autocast_enabled(dev)
                    for dt in [torch.get_autocast_dtype(dev)]]
        if autocast:
            self.baseline["autocast_dtype"] = str(autocast[0]).replace("torch.", "")
        return cuda

    def precision(self) -> str:
        """fp32, bf16, fp16-mixed, ... from the parameters' and autocast's dtypes."""
        dtype = str(self.baseline.get("param_dtype", "float32"))
        auto = self.baseline.get("autocast_dtype")
        short = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
        if auto:
            return f"{short.get(auto, auto)}-mixed"
        return short.get(dtype, dtype)


def note_optimizer(baseline: dict[str, Any], opt: Any) -> None:
    """The optimizer's class and first group's hyper-parameters into ``baseline``."""
    groups = opt.param_groups
    baseline["optimizer"] = type(opt).__name__
    if groups:
        hp = {k: _plain(groups[0][k]) for k in _OPT_KEYS if k in groups[0]}
        baseline["optimizer_hparams"] = hp
        if "lr" in hp:
            baseline["lr"] = hp["lr"]
        if "weight_decay" in hp:
            baseline["weight_decay"] = hp["weight_decay"]
        baseline["param_groups"] = len(groups)


def _plain(v: Any) -> Any:
    if isinstance(v, (int, float, bool, str)) or v is None:
        return v
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    try:
        return float(v)
    except Exception:
        return str(v)
