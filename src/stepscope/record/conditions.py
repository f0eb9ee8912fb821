"""The conditions a run ran under, sampled off the training thread.

A :class:`ConditionSampler` reads what the host and the device were doing, and a
:class:`ConditionLog` (the recorder's writer thread calls its ``tick`` at flush cadence)
appends one record per sample to ``RUN/conditions/rank-NNNNN.jsonl``. Every source is
optional: whatever cannot be read is left out of the record, never guessed.

Host (Linux ``/proc``, one read each, no dependency):

* ``host_busy_frac``, ``host_steal_frac``, ``host_iowait_frac``: shares of all CPUs' time
  since the previous sample (``/proc/stat`` first line: user nice system idle iowait irq
  softirq steal). Steal is time a hypervisor gave this VM's CPUs to someone else.
* ``others_cpu_cores``: CPU cores busy with *other* processes, ``host_busy_frac x ncpu``
  minus this process's own cores: the noisy-neighbour signal, in cores.
* ``proc_cpu_cores``: this process's CPU seconds per wall second (all threads).
* ``main_oncpu_frac``, ``main_runq_frac``: shares of wall time the process's main thread
  (the training loop) spent on a CPU and runnable but waiting for one
  (``/proc/self/schedstat``). Waiting in the run queue is contention itself: it tells a
  thread starved by neighbours from one that sleeps (I/O, a queue), which does not queue.
* ``procs_running``: runnable tasks now (``/proc/stat``), ``load_1m`` (``/proc/loadavg``),
  ``ncpu`` (CPUs this process may run on).
* ``cpu_mhz``: mean current clock (cpufreq ``scaling_cur_freq``, else ``/proc/cpuinfo``).

NVIDIA device (``nvidia-ml-py``, imported only when a sample is first taken, and only if it
is installed and a driver answers): ``gpu_sm_clock_mhz``, ``gpu_sm_clock_max_mhz``,
``gpu_throttle_reasons`` (the NVML clocks-event bitmask, idle and application-clock bits
removed), ``gpu_temp_c``, ``gpu_power_w``, ``gpu_util_pct``, ``gpu_other_procs`` (compute
processes on the device other than this one).

The clocks are injected (``clock``, ``wall_clock``) and the /proc root is a parameter, so
tests use exact numbers; ``tick`` never raises into training.

Example::

    log = ConditionLog(run.conditions_path(0))
    rec.add_listener(log.on_records)   # the recorder's writer thread calls it
    log.tick()            # at most one sample per ``min_interval_s``
    log.close()
"""

from __future__ import annotations

import os
import resource
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..rundir.store import StepFileWriter

__all__ = ["ConditionSampler", "ConditionLog", "MIN_INTERVAL_S", "CONDITION_FIELDS"]

# One sample per half second at most (the writer's flush cadence): conditions change on
# the scale of seconds (a job starting beside the run, a clock stepping down); a sample
# costs three small /proc reads.
MIN_INTERVAL_S = 0.5
# Shares over a shorter interval are mostly timer-tick rounding (schedstat and /proc/stat
# advance in scheduler ticks of 1-10 ms): the closing sample is not written when the last
# one is more recent than this.
MIN_SHARE_INTERVAL_S = 0.2
# CPU clock re-read interval (clock changes worth naming last seconds, not milliseconds).
MHZ_EVERY_S = 5.0
# NVML clocks-event bits that mean "slowed down": everything but GPU idle (0x1) and the
# user's application-clock setting (0x2) (nvml.h, nvmlClocksEventReason*).
_NVML_BENIGN = 0x1 | 0x2

CONDITION_FIELDS: dict[str, str] = {
    "wall_time_s": "UNIX time of the sample (aligns with the steps' wall_time_s)",
    "interval_s": "seconds since the previous sample (shares are over this interval)",
    "host_busy_frac": "share of all CPUs' time not idle (0..1)",
    "host_steal_frac": "share of all CPUs' time stolen by the hypervisor (0..1)",
    "host_iowait_frac": "share of all CPUs' time idle waiting for I/O (0..1)",
    "proc_cpu_cores": "this process's CPU seconds per wall second",
    "others_cpu_cores": "cores busy with other processes (busy x ncpu - own)",
    "main_oncpu_frac": "share of wall time the main thread ran on a CPU",
    "main_runq_frac": "share of wall time the main thread was runnable but not running",
    "procs_running": "runnable tasks on the host now",
    "load_1m": "1-minute load average",
    "ncpu": "CPUs this process may run on",
    "cpu_mhz": "mean current CPU clock (MHz)",
    "gpu_sm_clock_mhz": "SM clock now (MHz)",
    "gpu_sm_clock_max_mhz": "maximum SM clock (MHz)",
    "gpu_throttle_reasons": "NVML clocks-event reasons that slow the device (bitmask)",
    "gpu_temp_c": "GPU temperature (C)",
    "gpu_power_w": "board power draw (W)",
    "gpu_util_pct": "GPU utilisation over NVML's last sample period (%)",
    "gpu_other_procs": "compute processes on the same device other than this one",
}


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _ncpu() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class _Nvml:
    """NVML readings of one device; ``None`` when nvidia-ml-py or a driver is missing."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.nvml, self.handle = nvml, handle

    @classmethod
    def open(cls) -> _Nvml | None:
        try:
            import pynvml  # nvidia-ml-py; optional, never imported at `import stepscope`
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
            return cls(pynvml, pynvml.nvmlDeviceGetHandleByIndex(_device_index()))
        except Exception:  # no driver, no device, an old library: no GPU conditions
            return None

    def read(self) -> dict[str, float]:
        n, h = self.nvml, self.handle
        out: dict[str, float] = {}
        probes: dict[str, Callable[[], float]] = {
            "gpu_sm_clock_mhz": lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
            "gpu_sm_clock_max_mhz": lambda: n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_SM),
            "gpu_throttle_reasons": lambda: float(
                int(n.nvmlDeviceGetCurrentClocksThrottleReasons(h)) & ~_NVML_BENIGN),
            "gpu_temp_c": lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
            "gpu_power_w": lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "gpu_util_pct": lambda: n.nvmlDeviceGetUtilizationRates(h).gpu,
            "gpu_other_procs": lambda: float(sum(
                1 for p in n.nvmlDeviceGetComputeRunningProcesses(h) if p.pid != os.getpid())),
        }
        for key, probe in probes.items():
            try:
                out[key] = float(probe())
            except Exception:  # one unsupported query (e.g. power on some boards) is skipped
                continue
        return out


def _device_index() -> int:
    """The NVML index of this rank's device: LOCAL_RANK through CUDA_VISIBLE_DEVICES."""
    local = int(os.environ.get("LOCAL_RANK", "0") or 0)
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
               if v.strip()]
    if visible and local < len(visible) and visible[local].isdigit():
        return int(visible[local])
    return local


class ConditionSampler:
    """Reads the host's (and the device's) conditions; each ``sample`` covers the time
    since the previous one. ``proc`` / ``sys`` roots are parameters for tests."""

    def __init__(self, *, proc: str | os.PathLike[str] = "/proc",
                 sys: str | os.PathLike[str] = "/sys", nvml: bool = True,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time,
                 own_cpu_s: Callable[[], float] = _own_cpu_s,
                 ncpu: Callable[[], int] = _ncpu) -> None:
        self._proc, self._sys = Path(proc), Path(sys)
        self._clock, self._wall, self._own, self._ncpu = clock, wall_clock, own_cpu_s, ncpu
        self._want_nvml = nvml
        self._nvml: _Nvml | None = None
        self._last: tuple[float, list[int] | None, float] | None = None
        self._sched_last: tuple[float, int, int] | None = None
        self._mhz_cache: tuple[float, float | None] | None = None

    def _stat(self) -> tuple[list[int] | None, float | None]:
        text = _read(self._proc / "stat")
        if text is None:
            return None, None
        cpu, running = None, None
        for line in text.splitlines():
            if line.startswith("cpu "):
                cpu = [int(x) for x in line.split()[1:9]]
                cpu += [0] * (8 - len(cpu))
            elif line.startswith("procs_running"):
                running = float(line.split()[1])
        return cpu, running

    def _mhz(self) -> float | None:
        freqs = []
        for f in sorted(self._sys.glob("devices/system/cpu/cpu[0-9]*/cpufreq/scaling_cur_freq")):
            text = _read(f)
            if text and text.strip().isdigit():
                freqs.append(int(text) / 1000.0)  # kHz -> MHz
        if not freqs:
            for line in (_read(self._proc / "cpuinfo") or "").splitlines():
                if line.startswith("cpu MHz"):
                    try:
                        freqs.append(float(line.split(":")[1]))
                    except (IndexError, ValueError):
                        continue
        return sum(freqs) / len(freqs) if freqs else None

    def sample(self) -> dict[str, float]:
        """One record; the first one has no interval shares (nothing to difference)."""
        now, own = self._clock(), self._own()
        cpu, running = self._stat()
        ncpu = self._ncpu()
        rec: dict[str, float] = {"wall_time_s": self._wall(), "ncpu": float(ncpu)}
        if running is not None:
            rec["procs_running"] = running
        load = (_read(self._proc / "loadavg") or "").split()
        if load:
            rec["load_1m"] = float(load[0])
        # The clock is read at most every MHZ_EVERY_S: /proc/cpuinfo of a 200-core host is
        # a megabyte of text, too much to parse every half second.
        if self._mhz_cache is None or now - self._mhz_cache[0] >= MHZ_EVERY_S:
            self._mhz_cache = (now, self._mhz())
        mhz = self._mhz_cache[1]
        if mhz is not None:
            rec["cpu_mhz"] = mhz
        if self._last is not None:
            rec.update(self._shares(now, cpu, own, ncpu))
        self._last = (now, cpu, own)
        rec.update(self._sched(now))
        rec.update(self._gpu())
        return rec

    def _shares(self, now: float, cpu: list[int] | None, own: float,
                ncpu: int) -> dict[str, float]:
        assert self._last is not None
        t0, cpu0, own0 = self._last
        dt = now - t0
        out: dict[str, float] = {"interval_s": dt}
        if dt <= 0:
            return out
        out["proc_cpu_cores"] = max(0.0, own - own0) / dt
        if cpu is None or cpu0 is None:
            return out
        d = [b - a for a, b in zip(cpu0, cpu, strict=True)]
        total = sum(d)
        if total <= 0:
            return out
        idle, iowait, steal = d[3], d[4], d[7]
        # Steal is counted outside the busy share: the CPU did not run anything of ours.
        out["host_busy_frac"] = (total - idle - iowait - steal) / total
        out["host_steal_frac"] = steal / total
        out["host_iowait_frac"] = iowait / total
        # /proc/stat counts every CPU of the host; the process may be limited to fewer.
        host_cpus = max(ncpu, os.cpu_count() or ncpu)
        out["others_cpu_cores"] = max(0.0, out["host_busy_frac"] * host_cpus
                                      - out["proc_cpu_cores"])
        return out

    def _sched(self, now: float) -> dict[str, float]:
        """Main-thread on-CPU and run-queue shares since the previous sample."""
        fields = (_read(self._proc / "self" / "schedstat") or "").split()
        if len(fields) < 2 or not (fields[0].isdigit() and fields[1].isdigit()):
            return {}
        cur = (now, int(fields[0]), int(fields[1]))  # ns on CPU, ns runnable and waiting
        last, self._sched_last = self._sched_last, cur
        if last is None or now <= last[0]:
            return {}
        dt_ns = (now - last[0]) * 1e9
        return {"main_oncpu_frac": (cur[1] - last[1]) / dt_ns,
                "main_runq_frac": (cur[2] - last[2]) / dt_ns}

    def _gpu(self) -> dict[str, float]:
        if self._want_nvml and self._nvml is None:
            self._want_nvml = False  # one attempt: NVML init is slow when absent
            self._nvml = _Nvml.open()
        return self._nvml.read() if self._nvml is not None else {}


class ConditionLog:
    """Appends condition samples to one JSONL file; ``tick`` is called by the writer
    thread at flush cadence and samples at most once per ``min_interval_s``."""

    def __init__(self, path: Path, sampler: ConditionSampler | None = None, *,
                 min_interval_s: float = MIN_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._writer = StepFileWriter(path)
        self._sampler = sampler or ConditionSampler()
        self._every = float(min_interval_s)
        self._clock = clock
        self._next = -float("inf")
        self._last = -float("inf")
        self._failed = False

    def tick(self, force: bool = False) -> None:
        """Sample and append if the interval has passed (or ``force``); never raises."""
        if self._failed:
            return
        now = self._clock()
        if not force and now < self._next:
            return
        if force and now - self._last < MIN_SHARE_INTERVAL_S:
            return
        self._next = now + self._every
        self._last = now
        try:
            self._writer.write([self._sampler.sample()])
        except Exception as exc:  # a broken /proc or NVML must never reach training
            self._failed = True
            warnings.warn(f"stepscope: condition sampling stopped ({exc})", RuntimeWarning,
                          stacklevel=2)

    def on_records(self, records: object) -> None:
        """A recorder listener: called on the writer thread after each batch is written."""
        self.tick()

    def close(self) -> None:
        self.tick(force=True)
        self._writer.close()
