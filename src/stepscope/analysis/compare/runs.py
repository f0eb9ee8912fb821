"""One-variable A/B comparison of two runs: fingerprint diff, speed and quality ledgers.

The field report's method: fix a baseline, change one variable, and keep two ledgers. A
speed-up counts (verdict ``landed``) only if the speed ledger says ``faster`` and the
quality ledger says ``holds``. When more than one baseline variable differs, no change can
be attributed to either and the verdict is ``invalid`` (the ledgers are still computed).

Variables that follow from another differing one are listed but not counted twice
(``DERIVED``: the parameter count and structure hash follow from the model's shape; the
data-parallel degree follows from the device count; the micro-batch from the global batch).
The field report's own example, "global_batch 1024→4096, num_devices 8→32", stays two
variables: the global batch is an optimisation variable of its own, whatever set it.
A variable recorded in only one run cannot be confirmed equal: it is listed with the
environment warnings, not counted.

Before any speed call, the two runs' own records of their conditions are compared
(``analysis.environment``: CPU per wall-second, preemptions, other processes, steal,
clocks). When they differ beyond the runs' noise, the speed verdict and the verdict are
``inconclusive``, the differences are listed under ``environment`` with their numbers, and
nothing is called ``landed``, ``faster`` or ``slower``.

Baseline variables are compared after normalisation (``normalise``: case, spacing and the
aliases of ``ALIASES``), so "AdamW" against "adamw" is not a change.

The classic trap is flagged: global batch raised without a larger LR or longer warm-up
(field report: "a global batch raised from 1024 to 4096 without a larger LR or longer
warmup flattens the loss curve").

Example::

    from stepscope.analysis.compare import compare_runs
    result = compare_runs(table_a, meta_a, table_b, meta_b, evals_a, evals_b, seed=0)
    result.verdict                    # "landed" | "not landed" | "invalid" | "inconclusive"
    result.to_dict()                  # the `stepscope compare --json` document
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...schema import BASELINE_FIELDS, ENVIRONMENT_FIELDS, RunMeta, StepTable
from ..env_evidence import ConditionDiff, condition_differences
from ..summary import Conditions
from .quality import EVAL_TOLERANCE_REL, QualityLedger, quality_ledger
from .speed import MIN_EFFECT_REL, N_BOOT, SpeedLedger, mark_inconclusive, speed_ledger

__all__ = [
    "Difference", "Comparison", "diff_fingerprints", "compare_runs", "batch_trap",
    "DERIVED", "JSON_KEYS", "VERDICTS", "ALIASES", "normalise",
]

# A variable is not counted as a separate change when one of these also differs.
DERIVED: dict[str, tuple[str, ...]] = {
    "num_params": ("model_name", "num_layers", "hidden_size", "num_heads", "vocab_size"),
    "model_structure_hash": ("model_name", "num_layers", "hidden_size", "num_heads",
                             "vocab_size", "num_params"),
    "dp": ("num_devices",),
    # The per-rank split of the global batch (global = micro x accumulation x dp): a new
    # micro-batch alongside a new global batch is one change, the global batch.
    "micro_batch": ("global_batch",),
}
# The `stepscope compare --json` top-level keys, in order (a stable contract for scripts).
JSON_KEYS: tuple[str, ...] = ("verdict", "differing", "environment", "speed", "quality")
VERDICTS: tuple[str, ...] = ("landed", "not landed", "invalid", "inconclusive")
# Spellings of one value (after lower-casing and dropping spaces, "-" and "_"): the names
# frameworks and configs use for the same precision, optimizer or switch.
ALIASES: dict[str, str] = {
    "float32": "fp32", "torch.float32": "fp32", "single": "fp32",
    "float16": "fp16", "torch.float16": "fp16", "half": "fp16",
    "bfloat16": "bf16", "torch.bfloat16": "bf16",
    "adamweightdecay": "adamw", "off": "none", "false": "none", "no": "none",
}


@dataclass(frozen=True)
class Difference:
    """One variable that differs: baseline (counts toward ``invalid``) or environment."""

    variable: str
    a: Any
    b: Any
    derived_from: str | None = None  # the differing variable this one follows from
    warning: str | None = None
    condition: str | None = None  # a run condition: "contention" | "throttling" | "waiting"

    def to_dict(self) -> dict[str, Any]:
        return {"variable": self.variable, "a": self.a, "b": self.b,
                "derived_from": self.derived_from, "warning": self.warning,
                "condition": self.condition}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Difference:
        return cls(d["variable"], d["a"], d["b"], derived_from=d["derived_from"],
                   warning=d["warning"], condition=d["condition"])

    @classmethod
    def of_condition(cls, d: ConditionDiff) -> Difference:
        return cls(d.name, d.a, d.b, warning=d.message, condition=d.kind)

    def __str__(self) -> str:
        return f"{self.variable} {_fmt(self.a)}\u2192{_fmt(self.b)}"


def _fmt(v: Any) -> str:
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    return "unset" if v is None else str(v)


def normalise(v: Any) -> Any:
    """A recorded value in a comparable spelling: strings lower-cased, spaces, "-" and "_"
    dropped, aliases resolved ("AdamW" == "adamw", "bfloat16" == "bf16")."""
    if isinstance(v, str):
        key = v.strip().lower().replace(" ", "").replace("-", "").replace("_", "")
        return ALIASES.get(key, key)
    return v


def _same(a: Any, b: Any) -> bool:
    """Equal as recorded after ``normalise``; numbers compare by value (8 == 8.0)."""
    num = (int, float)
    if isinstance(a, num) and isinstance(b, num) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    return bool(normalise(a) == normalise(b))


def _as_float(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def batch_trap(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """The trap message when B's global batch is larger while LR and warm-up are not.

    Example::

        batch_trap({"global_batch": 1024, "lr": 3e-4}, {"global_batch": 4096, "lr": 3e-4})
    """
    ga, gb = _as_float(a.get("global_batch")), _as_float(b.get("global_batch"))
    if ga is None or gb is None or gb <= ga:
        return None
    scaled = []
    for key in ("lr", "warmup_steps"):
        va, vb = _as_float(a.get(key)), _as_float(b.get(key))
        if va is not None and vb is not None and vb > va:
            scaled.append(key)
    if scaled:
        return None
    detail = ", ".join(f"{k} {'not scaled' if k in a and k in b else 'not recorded'}"
                       for k in ("lr", "warmup_steps"))
    return (f"global batch raised {_fmt(a.get('global_batch'))}\u2192"
            f"{_fmt(b.get('global_batch'))} ({gb / ga:.3g}x) with {detail}: the loss curve "
            "flattens; scale the LR (e.g. linearly, Goyal et al. 2017) or lengthen warm-up")


def diff_fingerprints(meta_a: RunMeta, meta_b: RunMeta
                      ) -> tuple[list[Difference], list[Difference]]:
    """(baseline differences, environment warnings) between two runs' run.json.

    Example::

        differing, env = diff_fingerprints(meta_a, meta_b)
        [str(d) for d in differing]     # ["global_batch 1024→4096", "num_devices 8→32"]
    """
    ba, bb = meta_a.baseline, meta_b.baseline
    keys = list(BASELINE_FIELDS) + sorted((set(ba) | set(bb)) - set(BASELINE_FIELDS))
    changed = [k for k in keys if k in ba and k in bb and not _same(ba[k], bb[k])]
    trap = batch_trap(ba, bb)
    differing = []
    for k in changed:
        src = next((s for s in DERIVED.get(k, ()) if s in changed), None)
        differing.append(Difference(k, ba[k], bb[k], derived_from=src,
                                    warning=trap if k == "global_batch" else None))
    env: list[Difference] = []
    for k in keys:
        if (k in ba) != (k in bb):
            env.append(Difference(k, ba.get(k), bb.get(k), warning=(
                f"baseline variable {k} recorded only in run {'A' if k in ba else 'B'}; "
                "cannot confirm it is unchanged")))
    ea, eb = meta_a.environment, meta_b.environment
    ekeys = list(ENVIRONMENT_FIELDS) + sorted((set(ea) | set(eb)) - set(ENVIRONMENT_FIELDS))
    for k in ekeys:
        if (k in ea or k in eb) and not _same(ea.get(k), eb.get(k)):
            env.append(Difference(k, ea.get(k), eb.get(k)))
    return differing, env


@dataclass
class Comparison:
    """Result of ``compare_runs``; ``to_dict`` is the ``--json`` document."""

    verdict: str
    differing: list[Difference]
    environment: list[Difference]
    speed: SpeedLedger
    quality: QualityLedger
    reasons: list[str] = field(default_factory=list)
    names: tuple[str, str] = ("A", "B")

    @property
    def independent(self) -> list[Difference]:
        """The differing variables that count (not derived from another one)."""
        return [d for d in self.differing if d.derived_from is None]

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "differing": [d.to_dict() for d in self.differing],
            "environment": [d.to_dict() for d in self.environment],
            "speed": self.speed.to_dict(),
            "quality": self.quality.to_dict(),
        }

    def to_store(self) -> dict[str, Any]:
        """``to_dict`` with what only the terminal and Markdown views show (the verdict's
        reasons, the runs' names), for :meth:`from_store`."""
        return {"comparison": self.to_dict(), "reasons": list(self.reasons),
                "names": list(self.names)}

    @classmethod
    def from_store(cls, d: Mapping[str, Any]) -> Comparison:
        """The comparison ``to_store`` gave. Equal to the original when its values survive
        JSON (a NaN does not: it is stored as null)."""
        c = d["comparison"]
        a, b = d["names"]
        return cls(verdict=c["verdict"],
                   differing=[Difference.from_dict(x) for x in c["differing"]],
                   environment=[Difference.from_dict(x) for x in c["environment"]],
                   speed=SpeedLedger.from_dict(c["speed"]),
                   quality=QualityLedger.from_dict(c["quality"]),
                   reasons=list(d["reasons"]), names=(a, b))


def _verdict(independent: Sequence[Difference], speed: SpeedLedger,
             quality: QualityLedger) -> tuple[str, list[str]]:
    if len(independent) > 1:
        listed = ", ".join(str(d) for d in independent)
        return "invalid", [f"{len(independent)} variables differ: {listed}; change one "
                           "variable at a time against the baseline"]
    reasons = [f"speed: {speed.verdict}", f"quality: {quality.verdict}"]
    if speed.verdict == "inconclusive":
        return "inconclusive", [*reasons, speed.reason]
    landed = speed.verdict == "faster" and quality.verdict == "holds"
    return ("landed" if landed else "not landed"), reasons


def compare_runs(table_a: StepTable, meta_a: RunMeta, table_b: StepTable, meta_b: RunMeta,
                 evals_a: Sequence[Mapping[str, Any]] = (),
                 evals_b: Sequence[Mapping[str, Any]] = (), *, seed: int = 0,
                 n_boot: int = N_BOOT, min_effect_rel: float = MIN_EFFECT_REL,
                 eval_tolerance_rel: float = EVAL_TOLERANCE_REL,
                 baseline_repeats: Sequence[tuple[StepTable, RunMeta | None]] = (),
                 conditions: tuple[Conditions | None, Conditions | None] = (None, None),
                 ) -> Comparison:
    """Compare run B against baseline A. Pure: reads tables and metadata, returns data.

    ``seed`` drives the bootstrap, so the same inputs always give the same intervals.
    ``baseline_repeats`` (runs of A's configuration) measure run-to-run noise.
    ``conditions``: each run's ``RunDir.read_conditions()`` (host/device samples).

    Example::

        ra, rb = RunDir.open("runs/base"), RunDir.open("runs/overlap")
        (ta, _), (tb, _) = ra.read_steps(), rb.read_steps()
        result = compare_runs(ta, ra.read_meta(), tb, rb.read_meta(),
                              ra.read_events("eval")[0], rb.read_events("eval")[0])
    """
    differing, environment = diff_fingerprints(meta_a, meta_b)
    speed = speed_ledger(table_a, meta_a, table_b, meta_b, seed=seed, n_boot=n_boot,
                         min_effect_rel=min_effect_rel, baseline_repeats=baseline_repeats,
                         conditions=conditions)
    cond = condition_differences(table_a, conditions[0], table_b, conditions[1])
    if cond:
        environment = [*environment, *(Difference.of_condition(d) for d in cond)]
        mark_inconclusive(speed, (
            f"the runs' conditions differ ({'; '.join(d.message for d in cond)}), so the "
            "speed difference cannot be attributed to the change; rerun both on a quiet "
            "host, interleave them, or measure the noise with `--repeat`"))
    quality = quality_ledger(table_a, table_b, evals_a, evals_b,
                             eval_tolerance_rel=eval_tolerance_rel)
    trap = batch_trap(meta_a.baseline, meta_b.baseline)
    if trap:
        quality.warnings.append(trap)
    independent = [d for d in differing if d.derived_from is None]
    verdict, reasons = _verdict(independent, speed, quality)
    names = (meta_a.name or meta_a.run_id, meta_b.name or meta_b.run_id)
    return Comparison(verdict=verdict, differing=differing, environment=environment,
                      speed=speed, quality=quality, reasons=reasons, names=names)
