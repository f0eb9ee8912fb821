"""Process helpers of tests/reliability: every child is bounded in time and ended.

Each `stepscope` started here runs in a session of its own, so a test that fails or times
out can SIGKILL all of it (and torchrun's workers, which get sessions of their own, are
found through /proc) instead of hanging CI or leaving processes behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "reliability" / "scripts"
BIN = Path(sys.executable).parent
STEPSCOPE = str(BIN / "stepscope")
TORCHRUN = str(BIN / "torchrun")


def script(name: str, *args: str) -> list[str]:
    return [sys.executable, str(SCRIPTS / name), *args]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("STEPSCOPE_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(extra)
    return env


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] != b"Z"


class Live:
    """A running command whose output is collected by threads; ``wait_for`` a line."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None,
                 cwd: Path | None = None) -> None:
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=env or clean_env(), cwd=cwd, start_new_session=True)
        self.out: list[str] = []
        self.err: list[str] = []
        self._threads = [threading.Thread(target=self._pump, args=(s, buf), daemon=True)
                         for s, buf in ((self.proc.stdout, self.out),
                                        (self.proc.stderr, self.err))]
        for t in self._threads:
            t.start()

    @staticmethod
    def _pump(stream: object, buf: list[str]) -> None:
        for line in iter(stream.readline, b""):  # type: ignore[attr-defined]
            buf.append(line.decode(errors="replace"))

    @property
    def stdout(self) -> str:
        return "".join(self.out)

    @property
    def stderr(self) -> str:
        return "".join(self.err)

    def wait_for(self, text: str, count: int = 1, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        while self.stdout.count(text) < count:
            if self.proc.poll() is not None or time.monotonic() > end:
                self.kill()
                raise AssertionError(f"never printed {text!r} x{count}: rc={self.proc.returncode}"
                                     f"\n{self.stdout}\n{self.stderr}")
            time.sleep(0.05)

    def wait(self, timeout: float) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.argv} did not end within {timeout} s\n"
                                 f"{self.stdout}\n{self.stderr}") from None
        for t in self._threads:
            t.join(timeout=10)
        return rc

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)


def run(argv: list[str], timeout: float, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run to the end (killed at ``timeout``, which fails the test); output captured."""
    live = Live(argv, env, cwd)
    rc = live.wait(timeout)
    return subprocess.CompletedProcess(argv, rc, live.stdout, live.stderr)


def stepscope(*args: str, timeout: float = 120, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run([STEPSCOPE, *args], timeout, env, cwd)


def no_traceback(proc: subprocess.CompletedProcess[str]) -> None:
    text = proc.stdout + proc.stderr
    assert "Traceback (most recent call last)" not in text, text


@contextlib.contextmanager
def cpu_hogs(n: int, cpu: int = 0, limit_s: int = 180) -> Iterator[None]:
    """``n`` busy-loop processes pinned to CPU ``cpu`` (the one the measured run is pinned
    to, so they contend with it whatever else the host runs); each is bounded by
    ``timeout limit_s`` and SIGKILLed, with its session, on exit."""
    code = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
    procs = [subprocess.Popen(["timeout", str(limit_s), sys.executable, "-c", code],
                              start_new_session=True) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
