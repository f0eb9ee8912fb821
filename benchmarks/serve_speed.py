"""Dashboard speed: first paint of the runs table and of a long run's page, and the server's
memory, against TensorBoard loading the same scalars, measured in the same run.

The root holds ``--runs`` small runs and one long run of ``--steps`` x ``--ranks`` records
(target: 1,000 runs and 1,000,000 x 8). Step files are written directly as JSON lines
in the recorder's format (fast to make; the reader does not care who wrote them).

Measured, each with a fresh server process, in headless Debian Chromium driven by
Playwright, on three states of the root: cold (the run files alone: no index, no step or
page cache), indexed (the index and step caches the cold pass left, no page documents: a
finished run nobody has opened yet; ``stepscope run`` leaves the step cache when it writes
report.html) and warm (everything the earlier passes left):
1. runs table first paint: from navigation to the table's rows in the DOM (on a cold root
   the runs are listed from run.json while the index reads their steps); and the runs
   table complete: every run's numbers in (the index built, the page's 2-second reload);
2. run page first paint: from navigation to every chart drawn (decimated series);
3. the server's peak RSS after both (it must not grow with the steps shown);
0. before those passes, once: the long run's page opened first on a cold root (a link to
   it, the index building meanwhile): its first paint (from a sample of the step files, the
   full read under way: report.serve_partial) and its full view (the sample replaced);
4. the anchor: the same per-step scalars (loss, lr, step time, tokens/s per step) written
   with TensorBoard's own writer (``tensorboard.summary.Writer``) and read back with its
   own loader (``EventAccumulator.Reload``), the time until the first scalar series is
   available to draw; the ratio anchor / stepscope's run-page first paint.

Run: ``.venv/bin/python benchmarks/serve_speed.py [--runs 1000 --steps 1000000 --ranks 8]
[--root DIR] [--no-tensorboard]`` (``--small`` for a quick check; ``--root`` keeps the
generated root and TensorBoard's events for the next run, which drops the root's index and
caches again before its cold pass). Needs the ``export`` and ``dev`` extras and chromium.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
PAGES_DIR = ".stepscope-pages"  # report.serve_pages.PAGES_DIR (checked in main)


def _meta(name: str, ranks: int) -> dict[str, Any]:
    return {"run_id": name, "name": name, "created_utc": "2026-12-01T00:00:00Z",
            "status": "finished", "baseline": {"num_devices": ranks, "seq_len": 2048,
                                               "global_batch": 8 * ranks},
            "environment": {"framework": "torch"}, "config": {}, "schema_version": 1}


def write_run(path: Path, steps: int, ranks: int, seed: int) -> None:
    """One run: step time ~0.5 s with noise and a slow rank, loss decaying."""
    (path / "steps").mkdir(parents=True)
    (path / "run.json").write_text(json.dumps(_meta(path.name, ranks)))
    rng = np.random.default_rng(seed)
    chunk = 100_000
    for r in range(ranks):
        with open(path / "steps" / f"rank-{r:05d}.jsonl", "w") as fh:
            for lo in range(0, steps, chunk):
                s = np.arange(lo, min(lo + chunk, steps))
                t = 0.5 + 0.02 * rng.standard_normal(len(s)) + (0.05 if r == ranks - 1 else 0)
                loss = 8.0 * np.exp(-s / (steps / 3 + 1)) + 2.0
                end = np.cumsum(t) + lo * 0.5
                fh.writelines(
                    f'{{"rank":{r},"step":{int(a)},"end_s":{e:.6f},"wall_time_s":{1.7e9 + e:.3f},'
                    f'"step_time_s":{b:.6f},"data_wait_s":0.001,"forward_s":{0.3 * b:.6f},'
                    f'"backward_s":{0.6 * b:.6f},"tokens":4096.0,"samples":2.0,'
                    f'"loss":{c:.6f},"lr":0.0003}}\n'
                    for a, b, c, e in zip(s.tolist(), t.tolist(), loss.tolist(), end.tolist(),
                                          strict=True))


def make_root(root: Path, runs: int, steps: int, ranks: int) -> Path:
    for i in range(runs):
        write_run(root / f"exp-{i:04d}", 50, 1, i)
    big = root / "long-run"
    write_run(big, steps, ranks, 12345)
    return big


def write_tensorboard(big: Path, logdir: Path) -> None:
    """The long run's rank-0 scalars, written with TensorBoard's own writer."""
    from tensorboard.summary import Writer

    writer = Writer(str(logdir))
    with open(big / "steps" / "rank-00000.jsonl") as fh:
        for line in fh:
            r = json.loads(line)
            s = r["step"]
            writer.add_scalar("loss", r["loss"], s)
            writer.add_scalar("lr", r["lr"], s)
            writer.add_scalar("step_time_s", r["step_time_s"], s)
            writer.add_scalar("tokens_per_s", r["tokens"] / r["step_time_s"], s)
    writer.close()


def tensorboard_load(logdir: Path) -> float:
    """Seconds until TensorBoard's own loader has the scalars to draw."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    t0 = time.perf_counter()
    acc = EventAccumulator(str(logdir), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    tags = acc.Tags()["tensors"] or acc.Tags()["scalars"]
    assert tags, "TensorBoard loaded no scalars"
    return time.perf_counter() - t0


def _serve(root: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "stepscope", "serve", str(root), "--port",
                             "0"], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.search(r"(http://\S+)", line)
    if not m:
        proc.kill()
        raise SystemExit(f"serve did not start: {line!r}")
    return proc, m.group(1)


def _rss_peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _open_page(p: Any) -> tuple[Any, Any]:
    """Headless Debian chromium (Playwright's own download does not work here), one page."""
    browser = p.chromium.launch(executable_path=CHROMIUM, args=[
        "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"])
    return browser, browser.new_page(viewport={"width": 1400, "height": 1000})


def first_paints(root: Path) -> tuple[float, float, float, float]:
    from playwright.sync_api import sync_playwright

    proc, url = _serve(root)
    try:
        with sync_playwright() as p:
            browser, page = _open_page(p)
            t0 = time.perf_counter()
            page.goto(url)
            page.wait_for_selector("#runs tr td", timeout=600_000)
            table_s = time.perf_counter() - t0
            while "indexing" in page.inner_text("#count"):
                page.wait_for_timeout(20)
            complete_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            page.goto(url + "#/run/long-run")
            while not page.evaluate(_ALL_CHARTS):
                page.wait_for_timeout(20)
            run_s = time.perf_counter() - t0
            browser.close()
        return table_s, complete_s, run_s, _rss_peak_mib(proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


_ALL_CHARTS = ("document.querySelectorAll('.uplot').length >= 6 && "
               "charts.every(c => c.data[0].length > 0)")


def run_page_first(root: Path) -> tuple[float, float, float, bool]:
    """(first paint, full view, server peak RSS MiB, whether the first paint was a sample)
    of the long run's page opened first on a cold root (no index yet: built meanwhile)."""
    from playwright.sync_api import sync_playwright

    proc, url = _serve(root)
    try:
        with sync_playwright() as p:
            browser, page = _open_page(p)
            t0 = time.perf_counter()
            page.goto(url + "#/run/long-run")
            while not page.evaluate(_ALL_CHARTS):
                page.wait_for_timeout(20)
            first_s = time.perf_counter() - t0
            sampled = bool(page.evaluate("document.querySelector('#partial') !== null"))
            while not page.evaluate("document.querySelector('#partial') === null && "
                                    + _ALL_CHARTS):
                page.wait_for_timeout(20)
            full_s = time.perf_counter() - t0
            browser.close()
        return first_s, full_s, _rss_peak_mib(proc.pid), sampled
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def _drop_caches(root: Path) -> None:
    """A cold root: no index, no page or step cache (the run files alone)."""
    from stepscope.rundir.index import INDEX_FILE

    for p in root.glob(INDEX_FILE + "*"):
        p.unlink()
    shutil.rmtree(root / PAGES_DIR, ignore_errors=True)
    for d in root.glob("*/.cache"):
        shutil.rmtree(d)


def _tb_events(big: Path, where: Path) -> Path:
    """TensorBoard's event files of the long run, written once beside the root."""
    done = where / ".complete"
    if not done.exists():
        shutil.rmtree(where, ignore_errors=True)
        write_tensorboard(big, where)
        done.touch()
    return where


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--small", action="store_true", help="100 runs, 20,000 x 8 records")
    ap.add_argument("--root", "--keep", dest="root", type=Path, default=None,
                    help="build the root here once and keep it (with TensorBoard's events "
                         "in ROOT.tb); a root built before is reused")
    ap.add_argument("--passes", type=int, default=3,
                    help="fresh server processes in turn: the first on a cold root (no "
                         "index, no page or step cache); the second 'indexed': the index "
                         "and step caches the first left, the page documents dropped (a "
                         "finished run nobody has opened yet); the rest on all it left")
    ap.add_argument("--no-first", action="store_true",
                    help="skip the long run's page opened first on a cold root")
    ap.add_argument("--no-tensorboard", action="store_true",
                    help="skip the TensorBoard anchor (its events take minutes to write)")
    args = ap.parse_args()
    from stepscope.report.serve_pages import PAGES_DIR as pages

    assert pages == PAGES_DIR, pages
    if args.small:
        args.runs, args.steps, args.ranks = 100, 20_000, 8
    tmp = Path(tempfile.mkdtemp(prefix="serve-speed-"))
    root = args.root or tmp / "root"
    try:
        t0 = time.perf_counter()
        if (root / ".complete").exists():
            big = root / "long-run"
            print(f"root: reused {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
            big = make_root(root, args.runs, args.steps, args.ranks)
            (root / ".complete").touch()
            print(f"root: {args.runs} runs + one of {args.steps:,} steps x {args.ranks} "
                  f"ranks ({time.perf_counter() - t0:.1f} s to write)")
        tb = None
        if not args.no_tensorboard:
            t0 = time.perf_counter()
            tb = _tb_events(big, root.with_name(root.name + ".tb"))
            print(f"TensorBoard events ready ({time.perf_counter() - t0:.1f} s)")
        if not args.no_first:
            _drop_caches(root)
            first = run_page_first(root)
            print("run page opened first on a cold root (index building meanwhile): first "
                  f"paint {first[0]:.2f} s ({'sampled' if first[3] else 'whole'}), full view "
                  f"{first[1]:.2f} s, server "
                  f"peak RSS {first[2]:.0f} MiB", flush=True)
        _drop_caches(root)
        kinds = [("cold", "indexed")[i] if i < 2 else "warm" for i in range(args.passes)]
        rows = []
        for i, kind in enumerate(kinds):
            if kind == "indexed":
                shutil.rmtree(root / PAGES_DIR, ignore_errors=True)
            rows.append(first_paints(root))
            print(f"pass {i + 1} ({kind}): " + ", ".join(f"{v:.2f}" for v in rows[-1]),
                  flush=True)
        print(f"{'measure':<46}" + "".join(f"{k:>10}" for k in kinds))
        names = ("runs table first paint (s)", "runs table complete, all indexed (s)",
                 "run page first paint, all charts (s)", "server peak RSS (MiB)")
        for j, name in enumerate(names):
            print(f"{name:<46}" + "".join(f"{r[j]:>10.2f}" for r in rows))
        if tb is not None:
            anchor = tensorboard_load(tb)
            print(f"{'TensorBoard: load the same scalars (s)':<46}{anchor:>10.2f}")
            print("ratio TensorBoard load / stepscope run page: " + ", ".join(
                f"{anchor / r[2]:.1f}x" for r in rows) + " (target >= 5x)")
        print("first-paint target: under 2 s each")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
