"""A prepared check of stepscope on one NVIDIA GPU: one command, a table.

    python benchmarks/gpu_check.py [--out DIR] [--budget-s 480]

Five checks, each bounded in time, each a row of PASS / FAIL / SKIP with its numbers:

1. ``phases``: the demo GPT (``stepscope.demo.torch_gpt.GPT``) trains on CUDA under
   ``stepscope run --profile-steps 10:13``; the records' forward / backward / optimizer
   means over the profiled steps against the ``stepscope trace`` phase means of the same
   capture (within 10% per phase, the bar; phases under 0.5 ms are not judged:
   at that size launch jitter dominates).
2. ``memory``: per-step CUDA allocator peaks on two models whose pattern is known: one
   allocates a large temporary in every step and frees it (peak >> held at step end), one
   holds a large persistent buffer (peak ~ held). ``diagnose`` must name "temporary
   buffers" for the first and "plateau" for the second.
3. ``mfu``: a matmul-bound model (bf16 Linear stack, no bias) recorded with 6 x params
   FLOPs per token against the datasheet peak of ``stepscope.calc.hardware``; its MFU must
   be below 100%, at most the measured bf16 matmul rate over the peak (+5% for timer
   noise), and at least half of it (the model is nothing but matmuls).
4. ``hta``: the capture of check 1 through ``stepscope trace --hta-compatible --json``:
   an accelerator view with compute time on rank 0.
5. ``nvml``: the condition samples of check 1 hold the SM clock, temperature and power
   (needs ``nvidia-ml-py``; SKIP without it).

Exits 0 with "no CUDA device: skipped" where there is no CUDA device (CI stays green),
1 when a check fails, 0 otherwise. Every subprocess has a timeout; the whole run stays
under ``--budget-s`` (default 8 minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

PROFILE = (10, 13)  # half-open, as --profile-steps 10:13
PHASE_TOL = 0.10
PHASE_MIN_S = 5e-4

DEMO_SCRIPT = textwrap.dedent('''
    import sys
    import torch
    import torch.nn.functional as F
    from stepscope.demo.torch_gpt import GPT, GPTConfig
    torch.manual_seed(0)
    big = sys.argv[2] == "cuda"
    cfg = GPTConfig(n_layer=8 if big else 2, n_head=8 if big else 4,
                    d_model=512 if big else 128, seq_len=512 if big else 64)
    dev = sys.argv[2]
    model = GPT(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(int(sys.argv[1])):
        x = torch.randint(0, cfg.vocab_size, (16, cfg.seq_len), device=dev)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
''')


@dataclass
class Row:
    name: str
    status: str = "FAIL"  # PASS | FAIL | SKIP
    detail: str = ""
    numbers: dict[str, Any] = field(default_factory=dict)


def _stepscope(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    cmd = [str(Path(sys.executable).parent / "stepscope"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _json(*args: str, timeout: float = 120) -> Any:
    proc = _stepscope(*args, "--json", timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"stepscope {' '.join(args)} exited {proc.returncode}: "
                           f"{proc.stderr.strip()[-400:]}")
    return json.loads(proc.stdout)


# -- check 1 and its capture ---------------------------------------------------------------
def run_demo(out: Path, device: str = "cuda") -> Path:
    script = out / "demo_cuda.py"
    script.write_text(DEMO_SCRIPT)
    run = out / "demo-run"
    proc = _stepscope("run", "--out", str(run), "--profile-steps", f"{PROFILE[0]}:{PROFILE[1]}",
                      "--", sys.executable, str(script), "30", device, timeout=240)
    if proc.returncode != 0:
        raise RuntimeError(f"stepscope run exited {proc.returncode}: {proc.stderr[-400:]}")
    return run


def _record_phase_means(run: Path) -> dict[str, float]:
    from stepscope.rundir.store import RunDir

    table, _ = RunDir.open(run).read_steps()
    inside = (table["step"] >= PROFILE[0]) & (table["step"] < PROFILE[1])
    t = table.select(inside)
    if t.has_data("synced") and (t["synced"] == 1).any():
        t = t.select(t["synced"] == 1)
    out = {}
    for phase in ("forward", "backward", "optimizer"):
        col = f"{phase}_s"
        if len(t) and t.has_data(col):
            out[phase] = float(np.nanmean(t[col]))
    return out


def _capture(run: Path) -> Path:
    """The newest profile directory of the run (the analysis files beside it are not)."""
    dirs = sorted(p for p in (run / "profiles").iterdir() if p.is_dir())
    if not dirs:
        raise RuntimeError(f"no profile captured under {run / 'profiles'}")
    return dirs[-1]


def check_phases(run: Path) -> Row:
    row = Row("phases")
    prof = _capture(run)
    report = _json("trace", str(prof))
    rank = report["ranks"].get("0") or next(iter(report["ranks"].values()))
    traced = {p: rank["phase_means_us"].get(p, 0.0) / 1e6 for p in
              ("forward", "backward", "optimizer")}
    recorded = _record_phase_means(run)
    row.numbers = {"recorded_s": recorded, "traced_s": traced}
    bad = []
    for phase, rec in recorded.items():
        tr = traced.get(phase, 0.0)
        if max(rec, tr) < PHASE_MIN_S:
            continue
        if tr <= 0 or abs(rec / tr - 1.0) > PHASE_TOL:
            bad.append(f"{phase} {rec * 1e3:.2f} ms recorded vs {tr * 1e3:.2f} ms traced")
    if not recorded:
        bad.append("no phase times recorded")
    row.status = "FAIL" if bad else "PASS"
    both = ", ".join(f"{p} {recorded[p] * 1e3:.2f}/{traced.get(p, 0.0) * 1e3:.2f} ms"
                     for p in recorded)
    row.detail = f"recorded/traced: {both}" + (f"; off by > 10%: {'; '.join(bad)}" if bad else "")
    return row


def check_hta(run: Path) -> Row:
    row = Row("hta")
    prof = _capture(run)
    report = _json("trace", str(prof), "--hta-compatible")
    rank = report["ranks"].get("0") or next(iter(report["ranks"].values()))
    row.numbers = {k: rank.get(k) for k in ("view", "idle_pct", "compute_pct",
                                            "non_compute_pct", "comm_comp_overlap_pct")}
    ok = rank.get("view") == "accelerator" and (rank.get("compute_pct") or 0) > 0
    row.status = "PASS" if ok else "FAIL"
    row.detail = (f"view {rank.get('view')}, compute {rank.get('compute_pct')}%, "
                  f"idle {rank.get('idle_pct')}%")
    return row


def check_nvml(run: Path) -> Row:
    row = Row("nvml")
    try:
        import pynvml  # noqa: F401
    except ImportError:
        row.status, row.detail = "SKIP", "nvidia-ml-py not installed (pip install nvidia-ml-py)"
        return row
    from stepscope.rundir.store import RunDir

    samples = [s for rank in RunDir(run).read_conditions().values() for s in rank]
    keys = ("gpu_sm_clock_mhz", "gpu_temp_c", "gpu_power_w")
    have = {k: [s[k] for s in samples if k in s] for k in keys}
    row.numbers = {k: (max(v) if v else None) for k, v in have.items()}
    row.numbers["samples"] = len(samples)
    missing = [k for k, v in have.items() if not v]
    row.status = "FAIL" if missing or not samples else "PASS"
    row.detail = (f"missing {', '.join(missing)}" if missing else
                  f"{len(samples)} samples; SM clock up to {row.numbers['gpu_sm_clock_mhz']:.0f}"
                  f" MHz, {row.numbers['gpu_temp_c']:.0f} C, {row.numbers['gpu_power_w']:.0f} W")
    return row


# -- check 2: memory patterns ---------------------------------------------------------------
def _memory_run(out: Path, temporary: bool) -> Path:
    import torch

    import stepscope
    from stepscope.integrations.torch import memory_probe

    probe, source = memory_probe("cuda")
    run = out / ("mem-temporary" if temporary else "mem-plateau")
    rec = stepscope.Recorder(run, rank=0, meta={"environment": {"mem_source": source}})
    held = torch.zeros(256 * 2**20 // 4, device="cuda")  # 256 MiB held throughout
    keep = [held]
    for _ in range(40):
        with rec.step(tokens=1.0):
            if temporary:  # 2 GiB allocated and freed inside every step
                tmp = torch.ones(2 * 2**30 // 4, device="cuda")
                float(tmp.sum())
                del tmp
            else:  # a persistent buffer the size of the held one, touched every step
                keep[0].add_(1.0)
            torch.cuda.synchronize()
            peak, alloc = probe()
            rec.log(mem_peak_bytes=peak, mem_alloc_bytes=alloc)
    rec.close()
    del held, keep
    torch.cuda.empty_cache()
    return run


def check_memory(out: Path) -> Row:
    row = Row("memory")
    seen = {}
    for temporary, want in ((True, "temporary buffers"), (False, "plateau")):
        run = _memory_run(out, temporary)
        d = _json("diagnose", str(run))
        msgs = [f["message"] for f in d["findings"] if f["category"] == "memory"]
        seen[want] = any(want in m for m in msgs)
        row.numbers[want] = msgs
    row.status = "PASS" if all(seen.values()) else "FAIL"
    row.detail = ", ".join(f"{k}: {'named' if v else 'not named'}" for k, v in seen.items())
    return row


# -- check 3: MFU of a matmul-bound model -----------------------------------------------------
def _matmul_rate(n: int = 8192, reps: int = 20) -> float:
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return 2.0 * n**3 * reps / (start.elapsed_time(end) / 1e3)


def check_mfu(out: Path) -> Row:
    import torch

    import stepscope
    from stepscope.calc.hardware import lookup_peak

    row = Row("mfu")
    name = torch.cuda.get_device_name(0)
    entry = lookup_peak(name, "bf16")
    if entry is None:
        row.status, row.detail = "SKIP", f"no datasheet peak for {name!r} in calc.hardware"
        return row
    rate = _matmul_rate()
    d, layers, tokens = 8192, 8, 8192
    model = torch.nn.Sequential(*(torch.nn.Linear(d, d, bias=False) for _ in range(layers)))
    model = model.cuda().to(torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    x = torch.randn(tokens, d, device="cuda", dtype=torch.bfloat16)
    run = out / "mfu-run"
    # 6 x params per token: forward 2, backward 4 (Kaplan et al. 2020); no attention term.
    rec = stepscope.Recorder(run, rank=0, meta={
        "baseline": {"num_devices": 1},
        "environment": {"flops_per_token": 6.0 * params, "peak_flops_per_device": entry.flops,
                        "peak_flops_source": entry.source, "flops_convention": "6N"}})
    for _ in range(30):
        with rec.step(tokens=float(tokens)):
            model(x).float().pow(2).mean().backward()
            for p in model.parameters():
                p.grad = None
            torch.cuda.synchronize()
    rec.close()
    mfu = _json("report", str(run), "--no-html")["mfu"]
    bound = rate / entry.flops
    row.numbers = {"mfu": mfu, "matmul_rate_flops": rate, "peak_flops": entry.flops,
                   "matmul_over_peak": bound, "device": name}
    ok = mfu is not None and mfu < 1.0 and 0.5 * bound <= mfu <= 1.05 * bound
    row.status = "PASS" if ok else "FAIL"
    row.detail = (f"MFU {100 * (mfu or 0):.1f}%; measured matmul {rate / 1e12:.0f} TFLOP/s = "
                  f"{100 * bound:.1f}% of the {entry.flops / 1e12:.0f} TFLOP/s datasheet peak")
    return row


# -- driver -----------------------------------------------------------------------------------
def _guard(name: str, fn: Callable[[], Row], deadline: float) -> Row:
    if time.monotonic() > deadline:
        return Row(name, "SKIP", "time budget spent")
    try:
        return fn()
    except Exception as exc:  # one broken check must not hide the others
        tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return Row(name, "FAIL", f"error: {tb[:300]}")


def _print(rows: list[Row], elapsed: float) -> None:
    width = max(len(r.name) for r in rows)
    print(f"stepscope GPU check ({elapsed:.0f} s)")
    print(f"{'check':<{width}}  status  detail")
    for r in rows:
        print(f"{r.name:<{width}}  {r.status:<6}  {r.detail}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="keep the runs here")
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("--self-test-cpu", action="store_true",
                    help="exercise the harness on the CPU (phases, hta, nvml only; hta "
                         "fails there by design: a CPU trace has no accelerator view)")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("no CUDA device: skipped (PyTorch is not installed)")
        return 0
    if not torch.cuda.is_available() and not args.self_test_cpu:
        print("no CUDA device: skipped")
        return 0
    device = "cpu" if args.self_test_cpu else "cuda"
    t0 = time.monotonic()
    deadline = t0 + args.budget_s - 60  # leave a minute for the last check to finish
    out = args.out or Path(tempfile.mkdtemp(prefix="stepscope-gpu-check-"))
    out.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    demo: list[Path] = []

    def phases() -> Row:
        demo.append(run_demo(out, device))
        return check_phases(demo[0])

    rows.append(_guard("phases", phases, deadline))
    for name, fn in (("hta", check_hta), ("nvml", check_nvml)):
        rows.append(_guard(name, (lambda f=fn: f(demo[0])) if demo else
                           (lambda n=name: Row(n, "FAIL", "no capture (phases check failed)")),
                           deadline))
    if device == "cuda":
        rows.append(_guard("memory", lambda: check_memory(out), deadline))
        rows.append(_guard("mfu", lambda: check_mfu(out), deadline))
    _print(rows, time.monotonic() - t0)
    print(f"runs kept in {out}")
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in rows], indent=2, default=str))
    return 1 if any(r.status == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
