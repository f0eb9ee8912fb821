"""Steps of fixed CPU work (numpy matmuls, one BLAS thread) recorded with
stepscope.Recorder(alerts=FILE), pinned to one CPU, until STOP exists (at most 3,000 steps).

    python cpu_steps.py RUN ALERTS STOP [--cpu C]
"""

import argparse
import os

for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = "1"

import numpy as np  # noqa: E402

import stepscope  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("run")
p.add_argument("alerts")
p.add_argument("stop")
p.add_argument("--cpu", type=int, default=None)
args = p.parse_args()
if args.cpu is not None:
    os.sched_setaffinity(0, {args.cpu})
rng = np.random.default_rng(0)
a = rng.standard_normal((256, 256)) / 16.0
rec = stepscope.Recorder(args.run, meta={"name": "cpu-steps"}, alerts=args.alerts,
                         flush_interval_s=0.2)
for _ in range(3000):
    if os.path.exists(args.stop):
        break
    with rec.step(tokens=256.0) as s:
        x = a
        for _ in range(16):
            x = np.tanh(x @ a)
        s.log(loss=float(np.abs(x).mean()))
rec.close()
