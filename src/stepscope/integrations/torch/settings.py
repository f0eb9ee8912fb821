"""What ``stepscope run`` asks of an instrumented process, read from its environment.

The ``STEPSCOPE_*`` switches are listed in :mod:`.auto`; :meth:`Settings.from_env` reads
them once, when the hooks are installed.

Example::

    settings = Settings.from_env()   # None unless STEPSCOPE_RUN_DIR is set
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ..._ranges import parse_step_range

__all__ = ["ENV_PREFIX", "Settings", "parse_steps"]

ENV_PREFIX = "STEPSCOPE_"


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(ENV_PREFIX + name, "").strip()
    try:
        return int(raw) if raw else default
    except ValueError:
        return default


def _env_float(name: str) -> float:
    raw = os.environ.get(ENV_PREFIX + name, "").strip()
    try:
        return float(raw) if raw else math.nan
    except ValueError:
        return math.nan


def parse_steps(spec: str) -> tuple[int, int] | None:
    """``"a:b"``, both included (stepscope's one ``a:b`` convention, :mod:`stepscope._ranges`)
    -> the half-open profiler window ``(a, b + 1)``; ``"a"`` -> ``(a, a + 1)``.

    >>> parse_steps("3:5")
    (3, 6)
    """
    rng = parse_step_range(spec, closed=True)
    if rng is None or rng.first is None or rng.last is None:
        return None
    return rng.first, rng.last + 1


@dataclass(frozen=True)
class Settings:
    """What the environment asks for (see the module docstring for each switch)."""

    run_dir: str
    name: str = ""
    max_steps: int = 0
    replay_data: bool = False
    replay_batches: int = 8
    noop_grad_sync: bool = False
    profile_steps: tuple[int, int] | None = None
    profile_dir: str = ""
    cross_rank_every: int = 20
    # 1 = every step. Computing the norm reads every gradient once (~1 ms per 10M
    # parameters on a CPU core); scripts that clip give it for free via clip_grad_norm_.
    grad_norm_every: int = 1
    tokens_per_step: float = math.nan
    samples_per_step: float = math.nan
    flops_convention: str = ""  # `stepscope run --flops-convention NAME`; "" = the default
    # MindSpore custom loops: device sync at the phase boundaries of every N-th step
    # (0 = never); MindSpore dispatches asynchronously even on CPU.
    sync_every: int = 10

    @classmethod
    def from_env(cls) -> Settings | None:
        run_dir = os.environ.get(ENV_PREFIX + "RUN_DIR", "").strip()
        if not run_dir:
            return None
        try:
            prof = parse_steps(os.environ.get(ENV_PREFIX + "PROFILE_STEPS", ""))
        except ValueError:
            prof = None
        return cls(
            run_dir=run_dir,
            name=os.environ.get(ENV_PREFIX + "RUN_NAME", ""),
            max_steps=_env_int("MAX_STEPS", 0),
            replay_data=os.environ.get(ENV_PREFIX + "REPLAY_DATA", "") == "1",
            replay_batches=max(1, _env_int("REPLAY_BATCHES", 8)),
            noop_grad_sync=os.environ.get(ENV_PREFIX + "NOOP_GRAD_SYNC", "") == "1",
            profile_steps=prof,
            profile_dir=os.environ.get(ENV_PREFIX + "PROFILE_DIR", ""),
            cross_rank_every=max(0, _env_int("CROSS_RANK_EVERY", 20)),
            grad_norm_every=max(0, _env_int("GRAD_NORM_EVERY", 1)),
            tokens_per_step=_env_float("TOKENS_PER_STEP"),
            samples_per_step=_env_float("SAMPLES_PER_STEP"),
            flops_convention=os.environ.get(ENV_PREFIX + "FLOPS_CONVENTION", "").strip(),
            sync_every=max(0, _env_int("SYNC_EVERY", 10)),
        )
