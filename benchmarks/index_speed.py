"""Experiment-index speed over 1,000 synthetic runs: full build, then incremental updates.

The runs are written through the real ``stepscope.Recorder`` with an injected clock (so
step times are exact and the run takes no wall time), ``--steps`` steps each, 10 baseline
variables varied across runs. Three passes are timed:

1. build: empty index, every run read and summarised.
2. no-op update: nothing changed; every run must be recognised as unchanged (0 read).
3. update after touching 10 runs (one extra step record each) and adding 5 runs: only
   those 15 are read.

Target: the build takes seconds, the updates a fraction of that.

Run: ``.venv/bin/python benchmarks/index_speed.py [--runs 1000 --steps 50]``
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time
from pathlib import Path

import stepscope
from stepscope.rundir.index import build_index


def write_run(path: Path, i: int, steps: int) -> None:
    """One synthetic run: step time depends on the configuration, loss decays."""
    devices = (8, 16, 32, 64)[i % 4]
    batch = (256, 512, 1024)[i % 3]
    params = (1e9, 7e9)[i % 2]
    # Step time that gives an MFU of 30-48% (6N FLOPs per token, H100 dense bf16 peak).
    step_s = batch * 2048 * 6 * params / (devices * 989e12 * (0.30 + 0.02 * (i % 10)))
    t = itertools.count()  # the recorder reads the clock at each step's start and end
    rec = stepscope.Recorder(
        path, rank=0, background=False,
        clock=lambda: next(t) * step_s, wall_clock=lambda: 1.7e9,
        meta={"name": f"exp-{i:04d}", "baseline": {
            "model_name": ("gpt-1b", "gpt-7b")[i % 2], "num_params": params,
            "num_devices": devices, "device_kind": "NVIDIA H100 80GB HBM3",
            "global_batch": batch, "micro_batch": 8, "grad_accum": batch // 8 // devices or 1,
            "lr": 3e-4, "warmup_steps": 100, "precision": "bf16-mixed", "seed": i},
            "environment": {"framework": "torch", "framework_version": "2.13.0",
                            "stepscope_version": stepscope.__version__,
                            "flops_per_token": 6 * params,
                            "peak_flops_per_device": 989e12}})
    for s in range(steps):
        with rec.step(tokens=batch * 2048, samples=batch) as st:
            st.log(loss=4.0 / (1 + 0.05 * s), comm_exposed_s=0.1, mem_peak_bytes=6e10)
    rec.close()


def _timed(root: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    res = build_index(root)
    dt = time.perf_counter() - t0
    s = res.stats
    return dt, (f"found={s.found} read={s.read} unchanged={s.unchanged} "
                f"removed={s.removed} skipped={s.skipped}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        for i in range(args.runs):
            write_run(root / f"run-{i:04d}", i, args.steps)
        print(f"wrote {args.runs} runs x {args.steps} steps in "
              f"{time.perf_counter() - t0:.2f} s")
        dt, what = _timed(root)
        print(f"build:                 {dt:7.3f} s  ({what})")
        dt, what = _timed(root)
        print(f"no-op update:          {dt:7.3f} s  ({what})")
        time.sleep(0.01)  # a distinct mtime even on coarse-timestamp filesystems
        for i in range(10):
            run = stepscope.RunDir.open(root / f"run-{i:04d}")
            run.steps_path(0).open("a").write('{"rank": 0, "step": 999, "step_time_s": 0.5}\n')
        for i in range(args.runs, args.runs + 5):
            write_run(root / f"run-{i:04d}", i, args.steps)
        dt, what = _timed(root)
        print(f"update (10 changed+5): {dt:7.3f} s  ({what})")


if __name__ == "__main__":
    main()
