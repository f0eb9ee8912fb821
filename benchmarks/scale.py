"""Scale benchmark: report, diagnose and compare on runs of millions of records.

Generates run directories of synthetic step records in the Recorder's own format
(``stepscope.record.records.rows_to_records``, one JSONL file per rank, ~400 bytes per record,
one straggler rank planted 15% slower), then times each command as a fresh process, cold
(no ``RUN/.cache``) and warm (cache built by the cold run), with its peak resident memory
(``wait4``: the maximum over the process and the workers it waited for). The floor is a
bulk decode of the same files in this process (``msgspec.json.Decoder().decode_lines`` per
file, into dicts: no validation, no columns). ``--before-src DIR`` also times the commands
with another checkout's ``src`` first on ``PYTHONPATH`` (e.g. the code before the columnar
reader), cold only: it has no cache.

Shapes: ``--full`` the target's 64 ranks x 150,000 steps and 1,024 ranks x 2,000 steps;
default a scale that fits in minutes; ``--small`` seconds; ``--shape RxS`` any (repeatable).
Targets: warm < 3 s, cold < 2x floor, peak < 2 GB at 9.6 M records, HTML < 5 s.

The floor is also decoded once right before each cold command ("floor beside"): the host's
speed drifts over minutes, and a cold command is best held against the decode next to it.
``--repeat N`` times the floor and each warm command N times (min and median: the host may
be shared); ``--keep`` reuses run directories already generated under ``--dir`` (and
keeps them), so a second benchmark of the 9.6-million-record shape skips the generation.
"All processes" is the peak of a command's processes together (the reader's workers, a
forked child), sampled in one more cold run (``TreeMemory``).

Run: ``.venv/bin/python benchmarks/scale.py [--small | --full] [--before-src /path/src]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgspec
import numpy as np
import orjson

from stepscope.record.records import rows_to_records
from stepscope.rundir.store import RunDir
from stepscope.schema import RunMeta

_NAMES = ["rank", "step", "end_s", "wall_time_s", "step_time_s", "data_wait_s", "forward_s",
          "backward_s", "optimizer_s", "comm_s", "comm_exposed_s", "tokens", "samples", "loss",
          "lr", "grad_norm", "mem_peak_bytes", "mem_alloc_bytes", "cpu_s", "preempt", "synced"]
_BATCH = 50_000
SHAPES = {"small": [(8, 5_000), (128, 200)], "default": [(32, 25_000), (512, 1_000)],
          "full": [(64, 150_000), (1024, 2_000)]}


def _rank_rows(rank: int, steps: int, seed: int, slow: float) -> np.ndarray:
    rng = np.random.default_rng(seed * 100_003 + rank)
    st = slow * (8.0 + rng.normal(0, 0.08, steps))
    st[0] *= 3  # warm-up step
    n = np.arange(steps, dtype=float)
    cols = [np.full(steps, float(rank)), n, np.cumsum(st), 1.7e9 + np.cumsum(st), st,
            st * 0.01, st * 0.3, st * 0.45, st * 0.1, st * 0.06, st * 0.02,
            np.full(steps, 524_288.0), np.full(steps, 128.0),
            3.0 / (1 + n / 5000) + rng.normal(0, 0.01, steps), np.full(steps, 3e-4),
            rng.gamma(2.0, 0.2, steps), np.full(steps, 6.4e10), np.full(steps, 3.2e10),
            st * 0.9, rng.integers(0, 10, steps).astype(float), np.zeros(steps)]
    return np.column_stack(cols)


def generate(path: Path, ranks: int, steps: int, seed: int = 0, keep: bool = False
             ) -> RunDir:
    """A run directory of ``ranks`` x ``steps`` records; rank ranks//3 is the straggler.

    ``keep``: a directory a previous call completed (its ``.generated`` marker) is reused."""
    marker = path / ".generated"
    if keep and marker.is_file() and marker.read_text() == f"{ranks}x{steps}:{seed}":
        return RunDir.open(path)
    run = RunDir.create(path, RunMeta(
        run_id=path.name, baseline={"num_devices": ranks, "model_name": "gpt-7b",
                                    "global_batch": 128 * ranks, "seq_len": 4096},
        environment={"framework": "torch", "flops_per_token": 6 * 7e9,
                     "peak_flops_per_device": 989e12, "device_name": "synthetic"}))
    for r in range(ranks):
        rows = _rank_rows(r, steps, seed, 1.15 if r == ranks // 3 else 1.0)
        with open(run.steps_path(r), "wb") as f:
            for i in range(0, steps, _BATCH):
                recs = rows_to_records(rows[i:i + _BATCH].tolist(), _NAMES)
                f.write(b"\n".join(orjson.dumps(x) for x in recs) + b"\n")
    run.update_meta(status="finished")
    marker.write_text(f"{ranks}x{steps}:{seed}")
    return run


def floor_s(run: RunDir) -> float:
    """The bulk decode, in a child process: decoding gigabytes here would raise this
    process's resident set, and a child started by fork/vfork + exec reports at least the
    parent's resident set at that moment as its own peak (Linux records the old address
    space's high-water mark at exec), which made every command's peak read ~2.9 GB."""
    out = subprocess.run([sys.executable, __file__, "--floor-of", str(run.path)],
                         capture_output=True, text=True, check=True, timeout=3600)
    return float(out.stdout.strip())


def _floor_here(path: Path) -> float:
    dec = msgspec.json.Decoder()
    t0 = time.perf_counter()
    for f in RunDir(path).step_files():
        dec.decode_lines(f.read_bytes())
    return time.perf_counter() - t0


def _own_peak_mb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _descendants(root: int) -> set[int]:
    """``root`` and every process below it (Linux: each process's parent, from /proc)."""
    parent: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(f"/proc/{entry.name}/stat").read_text()
            except OSError:
                continue  # gone meanwhile
            parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree = {root}
    while more := {p for p, pp in parent.items() if pp in tree} - tree:
        tree |= more
    return tree


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass  # gone meanwhile, or no such file (not Linux)
    return 0


class TreeMemory:
    """The most memory a process and its descendants held together, sampled every
    ``every`` seconds: the sum of their proportional set sizes (a page n processes share
    counts 1/n to each, so once in the sum). ``ru_maxrss`` is the largest single process:
    the reader's workers beside the command and a forked child's own pages are not in it.
    Sampling costs CPU, so it runs in a cold run of its own."""

    def __init__(self, pid: int, every: float = 0.1) -> None:
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(pid, every), daemon=True)
        self._thread.start()

    def _sample(self, pid: int, every: float) -> None:
        while not self._stop.wait(every):
            self.peak_kb = max(self.peak_kb, sum(map(_pss_kb, _descendants(pid))))

    def stop(self) -> float:
        """The peak, in MB."""
        self._stop.set()
        self._thread.join()
        return self.peak_kb / 1024


def timed(argv: list[str], src: str | None = None, tree: bool = False
          ) -> tuple[float, float]:
    """(wall seconds, peak RSS in MB) of ``python -m stepscope ARGV`` in a fresh process;
    ``tree``: the peak is that of all its processes together instead (``TreeMemory``)."""
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "stepscope", *argv], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sampler = TreeMemory(proc.pid) if tree else None
    _, status, usage = os.wait4(proc.pid, 0)
    dt = time.perf_counter() - t0
    together = sampler.stop() if sampler is not None else None
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode not in (0, 1):  # compare exits 1 for an invalid comparison
        raise SystemExit(f"stepscope {' '.join(argv)} failed ({proc.returncode}): {err}")
    return dt, together if together is not None else usage.ru_maxrss / 1024


def _commands(a: Path, b: Path, html: Path) -> dict[str, list[str]]:
    return {"report --json": ["report", str(a), "--json", "--no-html"],
            "report --html": ["report", str(a), "--json", "--html", str(html)],
            "diagnose": ["diagnose", str(a), "--json"],
            "compare": ["compare", str(a), str(b), "--json", "--allow-multi"]}


def bench_shape(root: Path, ranks: int, steps: int, before: str | None, repeat: int = 1,
                keep: bool = False, only: tuple[str, ...] = ()) -> list[str]:
    a = generate(root / f"a-{ranks}x{steps}", ranks, steps, seed=1, keep=keep)
    b = generate(root / f"b-{ranks}x{steps}", ranks, steps, seed=2, keep=keep)
    size = sum(f.stat().st_size for f in a.step_files()) / 1e6
    floors = [floor_s(a) for _ in range(repeat)]  # one run's files; compare reads two
    floor = min(floors)
    out = [f"\n### {ranks} ranks x {steps:,} steps = {ranks * steps:,} records, "
           f"{size:,.0f} MB per run; floor (bulk decode of one run) min {floor:.2f} s, "
           f"median {statistics.median(floors):.2f} s of {repeat}\n",
           "| command | cold s | warm s min | warm s median | cold / floor | warm / floor "
           "| floor beside s | cold / floor beside | peak MB cold | peak MB warm "
           "| all processes MB cold" + (" | before cold s | before peak MB cold |"
                                        if before else " |"),
           "|---|---|---|---|---|---|---|---|---|---|---" + ("|---|---|" if before else "|")]
    for name, argv in _commands(a.path, b.path, root / "r.html").items():
        if only and name not in only:
            continue
        shutil.rmtree(a.cache_dir, ignore_errors=True)
        shutil.rmtree(b.cache_dir, ignore_errors=True)
        # The host's speed drifts over minutes (a shared VM: 1.5x within one run was seen),
        # so the floor is also decoded right before each cold command, beside it.
        beside = floor_s(a)
        cold, cold_mb = timed(argv)
        warms = [timed(argv) for _ in range(repeat)]
        warm, warm_mb = min(w for w, _ in warms), max(m for _, m in warms)
        shutil.rmtree(a.cache_dir, ignore_errors=True)  # cold again, memory sampled
        shutil.rmtree(b.cache_dir, ignore_errors=True)
        _, together_mb = timed(argv, tree=True)
        runs = 2 if name == "compare" else 1
        row = (f"| {name} | {cold:.2f} | {warm:.2f} | "
               f"{statistics.median(w for w, _ in warms):.2f} | {cold / (floor * runs):.1f}x | "
               f"{warm / (floor * runs):.2f}x | {beside:.2f} | {cold / (beside * runs):.1f}x | "
               f"{cold_mb:,.0f} | {warm_mb:,.0f} | {together_mb:,.0f} |")
        if before:  # cold too: the caches left by the runs above would make it warm
            shutil.rmtree(a.cache_dir, ignore_errors=True)
            shutil.rmtree(b.cache_dir, ignore_errors=True)
            bt, bmb = timed(argv, before)
            row += f" {bt:.2f} | {bmb:,.0f} |"
        out.append(row)
        print(row, flush=True)
    if not keep:
        shutil.rmtree(a.path)
        shutil.rmtree(b.path)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--small", action="store_true", help="seconds: 8x5,000 and 128x200")
    group.add_argument("--full", action="store_true",
                       help="the target's 64x150,000 and 1,024x2,000 (~8 GB of files)")
    group.add_argument("--shape", action="append", metavar="RxS", help="ranks x steps")
    ap.add_argument("--before-src", default=None, help="also time this checkout's src/")
    ap.add_argument("--dir", default=None, help="where to generate (default: a temp dir)")
    ap.add_argument("--repeat", type=int, default=1, help="floor and warm runs (min, median)")
    ap.add_argument("--only", action="append", default=[], metavar="COMMAND",
                    help="time only this command (repeatable), e.g. 'report --json'")
    ap.add_argument("--floor-of", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--keep", action="store_true",
                    help="reuse and keep the run directories generated under --dir")
    args = ap.parse_args()
    if args.floor_of:
        print(_floor_here(Path(args.floor_of)))
        return
    shapes = ([tuple(int(x) for x in s.split("x")) for s in args.shape] if args.shape
              else SHAPES["small" if args.small else "full" if args.full else "default"])
    root = Path(args.dir or tempfile.mkdtemp(prefix="stepscope-scale-"))
    lines = [f"stepscope scale benchmark, {os.cpu_count()} CPUs; files in the page cache; "
             f"this process's own peak {_own_peak_mb():,.0f} MB (a command's peak is "
             "at least what this process held when it started it)"]
    try:
        for ranks, steps in shapes:
            print(f"generating {ranks} x {steps} ...", flush=True)
            lines += bench_shape(root, int(ranks), int(steps), args.before_src,
                                 max(1, args.repeat), args.keep and args.dir is not None,
                                 tuple(args.only))
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
