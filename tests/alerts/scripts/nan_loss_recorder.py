"""A loop recorded with stepscope.Recorder(alerts=FILE) whose loss is NaN at step 3.

``--then close``: records 6 steps, closes the recorder and prints one JSON line saying
whether the alert sender thread was still busy (blocked on the endpoint) when close()
returned. ``--then forever``: keeps stepping (for a test to SIGKILL), at most 2,000 steps.
"""

import argparse
import json
import math
import time

import stepscope

p = argparse.ArgumentParser()
p.add_argument("run")
p.add_argument("alerts")
p.add_argument("--then", choices=("close", "forever"), default="close")
args = p.parse_args()

rec = stepscope.Recorder(args.run, meta={"name": "nan-run"}, alerts=args.alerts,
                         flush_interval_s=0.1)
steps = 6 if args.then == "close" else 2000
for step in range(steps):
    with rec.step(tokens=1024) as s:
        time.sleep(0.02)
        s.log(loss=math.nan if step == 3 else 2.0 - 1e-3 * step)
    if step == 3:
        rec.flush()  # the rule runs on the writer thread now, not at the next flush
        time.sleep(0.5)  # the sender thread picks the alert up and blocks on the endpoint
if args.then == "close":
    # the sender thread, to show close did not wait (the recorder's alerts plug)
    dispatcher = rec._plugs.get("alerts").dispatcher
    rec.close()
    print(json.dumps({"sender_busy_after_close": dispatcher._thread.is_alive()}), flush=True)
