"""Measurement overhead of `stepscope run` on the demo-sized model (target: <= 1%).

Trains the demo GPT (``stepscope.demo.torch_gpt``: 4 layers, d=256, seq 256, batch 8) on
random tokens with an ordinary loop (DataLoader, AdamW, clip_grad_norm_), once plain and
once under ``stepscope run``, alternating A B A B ... so that drifts of a shared machine hit
both equally. Each run prints its own per-step times (``time.perf_counter`` around the
whole step, independent of stepscope); the first ``--warmup`` steps of each run are
dropped. Reports the minimum and the median step time of each mode and their ratios: on a
shared machine the minimum is the robust estimate (as ``timeit`` uses it: noise only ever
adds time), the median shows how noisy the machine was. The child uses one intra-op
thread by default so that two cores shared with other work give steadier times.

Usage::

    .venv/bin/python benchmarks/run_overhead.py [--rounds 3] [--steps 15] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def child(steps: int, batch: int, threads: int) -> None:
    """The training script measured (knows nothing of stepscope)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from stepscope.demo.torch_gpt import GPT, GPTConfig

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = GPTConfig()
    model = GPT(cfg)
    data = torch.randint(0, cfg.vocab_size, (steps * batch, cfg.seq_len + 1))
    loader = DataLoader(TensorDataset(data), batch_size=batch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    t_prev = time.perf_counter()
    for step, (b,) in enumerate(loader):
        x, y = b[:, :-1], b[:, 1:]
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, cfg.vocab_size),
                                                 y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        now = time.perf_counter()
        print(f"STEPTIME {step} {now - t_prev:.6f}", flush=True)
        t_prev = now


def _times(stdout: str, warmup: int) -> list[float]:
    return [float(m.group(2)) for m in re.finditer(r"STEPTIME (\d+) ([0-9.]+)", stdout)
            if int(m.group(1)) >= warmup]


def _one(instrumented: bool, a: argparse.Namespace, tmp: Path, i: int) -> list[float]:
    cmd = [sys.executable, __file__, "--child", "--steps", str(a.steps), "--batch",
           str(a.batch), "--threads", str(a.threads)]
    if instrumented:
        cmd = [str(BIN / "stepscope"), "run", "--out", str(tmp / f"run{i}"), "--", *cmd]
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE_")}
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return _times(out.stdout, a.warmup)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0 = default)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.child:
        child(a.steps, a.batch, a.threads)
        return
    tmp = Path(tempfile.mkdtemp(prefix="stepscope-overhead-"))
    plain: list[float] = []
    inst: list[float] = []
    try:
        for r in range(a.rounds):
            plain += _one(False, a, tmp, r)
            inst += _one(True, a, tmp, r)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lo_p, lo_i = min(plain), min(inst)
    mp, mi = statistics.median(plain), statistics.median(inst)
    result = {"plain_min_step_s": lo_p, "instrumented_min_step_s": lo_i,
              "ratio_min": lo_i / lo_p, "overhead_pct": 100.0 * (lo_i / lo_p - 1.0),
              "plain_median_step_s": mp, "instrumented_median_step_s": mi,
              "ratio_median": mi / mp, "steps_each": len(plain), "rounds": a.rounds,
              "threads": a.threads, "target_pct": 1.0}
    if a.json:
        print(json.dumps(result))
        return
    print(f"plain      step min {lo_p * 1e3:9.2f} ms  median {mp * 1e3:9.2f} ms"
          f"  ({len(plain)} steps)")
    print(f"stepscope  step min {lo_i * 1e3:9.2f} ms  median {mi * 1e3:9.2f} ms"
          f"  ({len(inst)} steps)")
    print(f"ratio (min) {lo_i / lo_p:.4f}  overhead {result['overhead_pct']:+.2f}%"
          f"  (target <= 1%); ratio (median) {mi / mp:.4f}")


if __name__ == "__main__":
    main()
