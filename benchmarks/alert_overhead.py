"""Alert overhead: step time with alerts to a black-hole webhook vs no alerts.

The black hole is a local TCP server that accepts every connection and never answers, so
every delivery runs into its timeout and is retried: the worst endpoint there is. The
rules are set to fire on almost every step (factor 1.01, one step in a row, no cool-down),
so the sender thread is never idle. Three arms per round in shuffled order on the same
model and batches: recorder only, recorder only again (A/A control: this machine's noise
floor in the same run), recorder with alerts. Prints the median of per-round ratios with a
95% bootstrap interval. Target: the alerts ratio inside the A/A interval (no measurable
difference).

Run: ``.venv/bin/python benchmarks/alert_overhead.py [--rounds 16 --steps 20]``
"""

from __future__ import annotations

import argparse
import random
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path


def black_hole() -> tuple[socket.socket, str]:
    """A listening socket that accepts and then ignores every request."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held: list[socket.socket] = []

    def loop() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            held.append(conn)  # never read, never answered, never closed

    threading.Thread(target=loop, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.getsockname()[1]}/hook"


def alert_file(tmp: Path, url: str) -> Path:
    p = tmp / "alerts.toml"
    p.write_text(f"""
[rules]
step_time_factor = 1.01
consecutive = 1
warmup_steps = 0
cooldown_s = 0
stall_after_s = 3600

[[sink]]
type = "webhook"
url = "{url}"
min_severity = "info"
timeout_s = 2.0
retries = 3
""")
    return p


def _model():  # type: ignore[no-untyped-def]
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    xs = [torch.randn(64, 256) for _ in range(4)]

    def step(rec, i: int) -> None:  # type: ignore[no-untyped-def]
        x = xs[i % len(xs)]
        with rec.step(tokens=x.numel(), samples=x.shape[0]) as s:
            loss = F.mse_loss(model(x), x)
            opt.zero_grad()
            loss.backward()
            opt.step()
            s.log(loss=float(loss.detach()))

    return step


def _ratio_ci(num: list[float], den: list[float], seed: int) -> tuple[float, float, float]:
    """Median of per-round ratios and its 95% bootstrap interval."""
    ratios = [x / y for x, y in zip(num, den, strict=True)]
    rng = random.Random(seed)
    boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    return statistics.median(ratios), boot[50], boot[1949]


def main() -> None:
    from stepscope import Recorder

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    srv, url = black_hole()
    step = _model()
    recs = {"plain": Recorder(tmp / "plain"), "control": Recorder(tmp / "control"),
            "alerts": Recorder(tmp / "alerts", alerts=alert_file(tmp, url))}
    for rec in recs.values():  # warm-up every arm
        for i in range(5):
            step(rec, i)
    times: dict[str, list[float]] = {k: [] for k in recs}
    rng = random.Random(0)
    for _ in range(args.rounds):
        arms = list(recs)
        rng.shuffle(arms)
        for arm in arms:
            t0 = time.perf_counter()
            for i in range(args.steps):
                step(recs[arm], i)
            times[arm].append((time.perf_counter() - t0) / args.steps)
    t0 = time.perf_counter()
    for rec in recs.values():
        rec.close()
    close_s = time.perf_counter() - t0
    events = (tmp / "alerts" / "events.jsonl").read_text().count('"type":"alert"')
    srv.close()
    p = statistics.median(times["plain"])
    print(f"training step, {args.rounds} rounds x {args.steps} steps, arms shuffled per round")
    print(f"  recorder only:             {p * 1e3:8.3f} ms/step (median)")
    print(f"  recorder + alerts:         {statistics.median(times['alerts']) * 1e3:8.3f} ms/step"
          f" (to a black-hole webhook; {events} alert records settled)")
    for label, arm in (("alerts ratio:", "alerts"), ("A/A control ratio:", "control")):
        med, lo, hi = _ratio_ci(times[arm], times["plain"], seed=1)
        print(f"  {label:26s} {med:.4f}  95% CI [{lo:.4f}, {hi:.4f}]")
    from stepscope.alerts.delivery import CLOSE_WAIT_S

    print(f"  close() of all three recorders: {close_s:.2f} s (the sender is given at most "
          f"{CLOSE_WAIT_S:g} s; what it has not sent stays pending in events.jsonl)")


if __name__ == "__main__":
    main()
