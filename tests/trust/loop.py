"""A training-like loop for the real-pair tests: fixed matmul work per step, recorded.

    python loop.py OUT --steps N [--work K] [--cpu C]

Each step multiplies a 256x256 matrix ``8 x K`` times (numpy, one BLAS thread; ~1.5 ms
per product on the 2-core test host) and records it through ``stepscope.Recorder`` with
its background writer, so the conditions sampler runs. ``--cpu C`` pins the process to CPU
C, so that a CPU hog the test pins to the same CPU contends with it whatever else the host
runs. The extra work of ``--work 2`` is a code change, not a baseline variable: the
baseline written to run.json is the same for every K.
"""

from __future__ import annotations

import argparse
import os

for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = "1"

import numpy as np  # noqa: E402

import stepscope  # noqa: E402

BASELINE = {"model_name": "matmul-loop", "seq_len": 256, "global_batch": 1,
            "num_devices": 1, "device_kind": "cpu", "optimizer": "none", "seed": 0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--work", type=int, default=1)
    ap.add_argument("--cpu", type=int, default=None)
    args = ap.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    rng = np.random.default_rng(0)
    a = rng.standard_normal((256, 256)) / 16.0
    rec = stepscope.Recorder(args.out, rank=0, meta={"name": os.path.basename(args.out),
                                                     "baseline": BASELINE})
    for _ in range(args.steps):
        with rec.step(tokens=256.0, samples=1.0) as s:
            with s.phase("forward"):
                x = a
                for _ in range(8 * args.work):
                    x = np.tanh(x @ a)
            s.log(loss=float(np.abs(x).mean()))
    rec.close()


if __name__ == "__main__":
    main()
