"""Framework-free facts about the host and the training code, for run.json.

Only edges call these (they read files and run ``git``); results are plain dicts, or the
calculators' :class:`~stepscope.calc.cpu.CpuInfo` (the pure CPU-peak function takes it).

Example::

    env = host_environment()            # python_version, hostname, platform, stepscope_version
    env.update(code_version("."))       # code_commit, code_dirty (when a git checkout)
    peak, why = cpu_peak_here("fp32", threads=2)   # this CPU's peak for a 2-thread run
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

from ..calc.cpu import CpuInfo, cpu_peak, parse_cpuinfo
from ..calc.hardware import PeakEntry
from ..version import __version__

__all__ = ["host_environment", "code_version", "cpu_model_name", "process_memory_bytes",
           "allowed_cpus", "cpu_facts", "cpu_peak_here"]


def host_environment() -> dict[str, Any]:
    return {
        "stepscope_version": __version__,
        "python_version": platform.python_version(),
        "hostname": socket.gethostname(),
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
    }


def code_version(path: str | os.PathLike[str] = ".") -> dict[str, Any]:
    """Git commit of the training code at ``path`` and whether it has local changes."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(path), *args], capture_output=True,
                                 text=True, timeout=5, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"code_commit": commit, "code_dirty": bool(status)}


def cpu_model_name() -> str:
    for line in (_read_text("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown cpu"


def process_memory_bytes() -> tuple[float, float]:
    """(peak RSS, current RSS) of this process from /proc/self/status (VmHWM, VmRSS).

    The peak is over the process lifetime (the kernel's high-water mark), and includes the
    framework, Python and data loaders: it is what the host had to provide, not tensors
    alone. NaN where /proc is unavailable.
    """
    peak = cur = float("nan")
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    peak = float(line.split()[1]) * 1024.0
                elif line.startswith(b"VmRSS:"):
                    cur = float(line.split()[1]) * 1024.0
    except OSError:
        pass
    return peak, cur


def allowed_cpus() -> int:
    """Logical CPUs this process may run on (sched_getaffinity; os.cpu_count elsewhere)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cpu_facts() -> CpuInfo:
    """This host's CPU facts: /proc/cpuinfo, the cpufreq maximum, the allowed CPUs."""
    return parse_cpuinfo(_read_text("/proc/cpuinfo") or "",
                         _read_text("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"),
                         allowed_cpus())


def cpu_peak_here(dtype: str = "fp32", threads: int | None = None,
                  clock_mhz: float | None = None) -> tuple[PeakEntry | None, str]:
    """(peak, why-not) of this CPU for a run with ``threads`` intra-op threads.

    One rule for ``stepscope run`` (threads = the framework's thread count) and ``stepscope
    mfu --device cpu`` (threads = --cores, default every allowed core): cores = min(threads,
    physical cores allowed), clock per :mod:`stepscope.calc.cpu`.
    """
    return cpu_peak(cpu_facts(), dtype, threads, clock_mhz)


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None
