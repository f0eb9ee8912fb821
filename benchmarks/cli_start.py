"""Whole-process start-up of the CLI: `stepscope --help` and `stepscope trace` vs baselines.

Usage::

    .venv/bin/python benchmarks/cli_start.py [--runs 9] [--trace FILE] [--hta-python PATH]

Measures wall time of whole processes (interpreter start, imports, work, exit), as a user
waits for them, each command ``--runs`` times, interleaved (A B C D A B C D ...) so that the
drifts of a shared machine hit every command alike, and prints medians and ratios:

- ``python -c pass``: a bare interpreter start, the floor;
- ``stepscope --help`` (the console script's code: ``from stepscope.cli import main``);
  target: within 15x of the bare interpreter;
- ``stepscope trace --json`` on a 218k-event GPU trace (two copies of the largest Kineto
  trace under ``shared/data/traces``, steps shifted and renumbered as
  ``benchmarks/trace_speed.py`` scales traces) vs HTA 0.5.0's load + temporal breakdown in
  its own process (``TraceAnalysis(trace_dir=...)`` + ``get_temporal_breakdown``), run by
  ``--hta-python`` (default ``.venv-hta/bin/python``; make it with
  ``python3 -m venv .venv-hta && .venv-hta/bin/pip install holistictraceanalysis==0.5.0``;
  skipped with a message when absent). Target: stepscope >= 8x faster.

``--baseline-src DIR`` also times both stepscope commands with the package found in DIR
(e.g. ``git archive <commit> src | tar -x -C /tmp/old``, then ``/tmp/old/src``) in the
same interleaved run, for before/after numbers from one machine state.
"""

from __future__ import annotations

import argparse
import gzip
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
from trace_speed import HTA_CHILD, _load, scale_up

REPO = Path(__file__).resolve().parents[1]
DEFAULT_HTA = REPO / ".venv-hta" / "bin" / "python"
# Targets: --help within 15x of a bare interpreter, trace --json >= 8x faster than HTA.
HELP_MAX_RATIO = 15.0
TRACE_MIN_SPEEDUP = 8.0
# Copies of the source trace's steps: 2 x the largest shared trace = 218k events.
TRACE_COPIES = 2
HTA = "HTA load + temporal breakdown"


def shared_traces() -> Path | None:
    """``shared/data/traces`` beside the checkout or beside any folder above it."""
    for parent in REPO.parents:
        cand = parent / "shared" / "data" / "traces"
        if cand.is_dir():
            return cand
    return None


def largest_kineto(root: Path) -> Path | None:
    files = [p for p in root.rglob("*.json*") if p.name.endswith((".json", ".json.gz"))
             and "mindspore" not in str(p) and "reference" not in p.name]
    return max(files, key=lambda p: p.stat().st_size) if files else None


def stepscope_argv(*args: str) -> list[str]:
    """What the ``stepscope`` console script runs, with this interpreter."""
    return [sys.executable, "-c", "import sys; from stepscope.cli import main; sys.exit(main())",
            *args]


Cmd = tuple[list[str], dict[str, str] | None]  # argv, environment (None: inherited)


def time_once(cmd: Cmd) -> float:
    argv, env = cmd
    t0 = time.perf_counter()
    res = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         timeout=600, env=env)
    dt = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} ... failed ({res.returncode}): "
                         f"{res.stderr.decode(errors='replace').strip()[-300:]}")
    return dt


def interleaved(cmds: dict[str, Cmd], runs: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {k: [] for k in cmds}
    for cmd in cmds.values():  # one untimed warm-up each: page cache, .pyc files
        time_once(cmd)
    for _ in range(runs):
        for name, cmd in cmds.items():
            out[name].append(time_once(cmd))
    return out


def make_trace(src: Path, tmp: Path) -> tuple[Path, int]:
    doc = scale_up(_load(src), TRACE_COPIES)
    n = len(doc["traceEvents"])
    d = tmp / f"x{TRACE_COPIES}"
    d.mkdir()
    (d / "rank0.pt.trace.json.gz").write_bytes(gzip.compress(orjson.dumps(doc),
                                                             compresslevel=1))
    return d, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9, help="timed runs per command")
    ap.add_argument("--trace", type=Path, default=None, help="Kineto trace to scale up")
    ap.add_argument("--hta-python", type=Path, default=DEFAULT_HTA)
    ap.add_argument("--baseline-src", type=Path, default=None,
                    help="a src/ folder of another stepscope version to time alongside")
    args = ap.parse_args()
    base_env = (dict(os.environ, PYTHONPATH=str(args.baseline_src.resolve()))
                if args.baseline_src else None)
    root = shared_traces()
    src = args.trace or (largest_kineto(root) if root else None)
    use_hta = args.hta_python.exists()
    if not use_hta:
        print(f"HTA skipped: {args.hta_python} not found (python3 -m venv .venv-hta && "
              ".venv-hta/bin/pip install holistictraceanalysis==0.5.0)")
    with tempfile.TemporaryDirectory(prefix="cli_start_") as tmp:
        cmds: dict[str, Cmd] = {"python -c pass": ([sys.executable, "-c", "pass"], None),
                                "stepscope --help": (stepscope_argv("--help"), None)}
        if base_env:
            cmds["baseline: stepscope --help"] = (stepscope_argv("--help"), base_env)
        if src is None:
            print("trace skipped: no Kineto trace under shared/data/traces; pass --trace")
        else:
            d, n = make_trace(src, Path(tmp))
            print(f"trace: {TRACE_COPIES} x {src.name} = {n:,} events")
            trace_argv = stepscope_argv("trace", str(d / "rank0.pt.trace.json.gz"), "--json")
            cmds["stepscope trace --json"] = (trace_argv, None)
            if base_env:
                cmds["baseline: stepscope trace --json"] = (trace_argv, base_env)
            if use_hta:
                cmds[HTA] = ([str(args.hta_python), "-c", HTA_CHILD, str(d)], None)
        times = interleaved(cmds, args.runs)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"{k:>32}: median {med[k] * 1e3:8.1f} ms  (min {min(v) * 1e3:.1f}, "
              f"max {max(v) * 1e3:.1f}, {len(v)} runs)")
    bare = med["python -c pass"]
    for prefix in ("", "baseline: ") if base_env else ("",):
        print(f"{prefix}--help / bare interpreter: {med[prefix + 'stepscope --help'] / bare:.1f}x "
              f"(target <= {HELP_MAX_RATIO:.0f}x)")
        trace = med.get(prefix + "stepscope trace --json")
        if HTA in med and trace:
            print(f"{prefix}HTA / stepscope trace (whole process): {med[HTA] / trace:.1f}x "
                  f"(target >= {TRACE_MIN_SPEEDUP:.0f}x)")


if __name__ == "__main__":
    main()
