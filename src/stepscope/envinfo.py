"""Framework-free facts about the host and the training code, for run.json.

Only edges call these (they read files and run ``git``); results are plain dicts.

Example::

    env = host_environment()            # python_version, hostname, platform, stepscope_version
    env.update(code_version("."))       # code_commit, code_dirty (when a git checkout)
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

from . import __version__

__all__ = ["host_environment", "code_version", "cpu_model_name", "process_memory_bytes"]


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
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
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
