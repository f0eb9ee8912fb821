"""A training loop recorded with stepscope.Recorder that runs until it is stopped
(a process for `stepscope watch` to follow, freeze and kill)."""

import sys
import time

import stepscope

rec = stepscope.Recorder(sys.argv[1], meta={"name": "watched"}, flush_interval_s=0.1)
step = 0
while True:
    with rec.step(tokens=1024) as s:
        time.sleep(0.02)
        s.log(loss=2.0 - 1e-4 * step)
    step += 1
    if step == 10:
        print("steps", flush=True)
