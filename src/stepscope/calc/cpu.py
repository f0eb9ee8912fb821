"""Peak FLOP/s of this machine's CPU, for MFU on CPU: only where it can be defended.

peak = cores x FLOP/cycle/core x clock, where

* FLOP/cycle/core = FMA units x SIMD lanes x 2 (an FMA is a multiply and an add). It is
  known per microarchitecture, which is identified from the vendor's CPUID family/model (the
  "model name" in VMs is often just "AMD EPYC"), never from the instruction-set flags alone:
  the same AVX-512 flags run on one or two 512-bit FMA units (Intel Xeon by SKU) or on two
  256-bit units double-pumped (AMD Zen 4).
* clock = /sys cpufreq ``cpuinfo_max_freq`` when the kernel exposes it (the highest clock, so
  the peak is not understated), else /proc/cpuinfo "cpu MHz" (in a VM: the nominal clock the
  hypervisor reports; boost above it would make MFU an overestimate -- said in the note).
* cores = physical cores among the CPUs this process may run on (``os.sched_getaffinity``,
  what torch's thread pool uses), divided by threads per core (SMT siblings share FMA units).

Known microarchitectures (fp32; FP64 is half):

* AMD Zen 5 server, family 1Ah models 00h-1Fh (EPYC 9005 "Turin", Zen 5 and 5c): four
  512-bit FP pipes of which two do FMA -> 2 x 16 x 2 = 64 FLOP/cycle. Source: AMD "Software
  Optimization Guide for the AMD Zen 5 Microarchitecture" (pub. 58455), FPU section; measured
  native 512-bit FMA throughput: A. Yee, "Zen5's AVX512 Teardown", numberworld.org, 2024.
  (Mobile Zen 5, models 20h+, has a narrower datapath and is not listed.)
* AMD Zen 4, family 19h models 10h-1Fh and A0h-AFh (EPYC 9004 "Genoa"/"Bergamo"): two
  256-bit FMA pipes, AVX-512 double-pumped -> 2 x 8 x 2 = 32. Source: AMD Software
  Optimization Guide for Family 19h (pub. 56665/57647); Yee, "Zen4's AVX512 Teardown", 2022.
* AMD Zen 3, family 19h models 00h-0Fh (EPYC 7003 "Milan"): two 256-bit FMA pipes -> 32.
  Source: AMD Software Optimization Guide for Family 19h (pub. 56665).

Not listed (return None, MFU needs --peak-tflops): Intel Xeon (one or two AVX-512 FMA units
depending on SKU, AMX tile throughput for bf16), Arm servers, and every bf16/fp16 figure on CPUs
(no vendor-published per-cycle throughput for VDPBF16PS on AMD; on this machine's Zen 5 bf16
matmuls measured ~1.5x the fp32 peak, so using the fp32 figure for bf16 would be wrong).

This machine (2025-11 sandbox): "AMD EPYC", family 26 (1Ah) model 2, 2 cores, 2596 MHz, no
cpufreq -> fp32 peak 2 x 64 x 2.596e9 = 332.3 GFLOP/s.

Example::

    entry = host_cpu_peak("fp32")        # PeakEntry(device="AMD Zen 5 server (...)", ...)
    if entry is None:
        print(explain_host_cpu_peak("fp32"))
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .hardware import PeakEntry

__all__ = ["CpuInfo", "read_cpuinfo", "cpu_peak", "host_cpu_peak", "explain_host_cpu_peak"]


@dataclass(frozen=True)
class _Microarch:
    name: str
    vendor: str
    family: int
    models: tuple[tuple[int, int], ...]
    fp32_flop_per_cycle: int
    source: str


_MICROARCHS = (
    _Microarch("AMD Zen 5 server (EPYC 9005)", "AuthenticAMD", 0x1A, ((0x00, 0x1F),), 64,
               "AMD Software Optimization Guide for Zen 5 (pub. 58455): two 512-bit FMA "
               "pipes -> 2 FMA x 16 fp32 lanes x 2 FLOP = 64 FLOP/cycle/core"),
    _Microarch("AMD Zen 4 (EPYC 9004)", "AuthenticAMD", 0x19, ((0x10, 0x1F), (0xA0, 0xAF)), 32,
               "AMD Software Optimization Guide for Family 19h: two 256-bit FMA pipes, "
               "AVX-512 double-pumped -> 2 x 8 x 2 = 32 FLOP/cycle/core"),
    _Microarch("AMD Zen 3 (EPYC 7003)", "AuthenticAMD", 0x19, ((0x00, 0x0F),), 32,
               "AMD Software Optimization Guide for Family 19h: two 256-bit FMA pipes "
               "-> 2 x 8 x 2 = 32 FLOP/cycle/core"),
)


@dataclass(frozen=True)
class CpuInfo:
    """What the peak needs from the machine; read by :func:`read_cpuinfo` at the edge."""

    vendor: str
    family: int
    model: int
    model_name: str
    mhz: float | None
    max_mhz: float | None
    threads_per_core: int
    cpus: int


def read_cpuinfo(cpuinfo_text: str | None = None, max_freq_khz: str | None = None,
                 cpus: int | None = None) -> CpuInfo:
    """Parse /proc/cpuinfo (first processor) and the cpufreq maximum; arguments for tests."""
    if cpuinfo_text is None:
        cpuinfo_text = _read("/proc/cpuinfo") or ""
    if max_freq_khz is None:
        max_freq_khz = _read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
    first = cpuinfo_text.split("\n\n")[0]
    fields = dict(_kv(line) for line in first.splitlines() if ":" in line)
    siblings, cores = _int(fields.get("siblings")), _int(fields.get("cpu cores"))
    tpc = max(1, siblings // cores) if siblings and cores else 1
    mhz = _float(fields.get("cpu MHz"))
    max_khz = _float(max_freq_khz.strip()) if max_freq_khz else None
    max_mhz = max_khz / 1000.0 if max_khz else None
    return CpuInfo(vendor=fields.get("vendor_id", ""), family=_int(fields.get("cpu family")),
                   model=_int(fields.get("model")), model_name=fields.get("model name", ""),
                   mhz=mhz, max_mhz=max_mhz, threads_per_core=tpc, cpus=cpus)


def cpu_peak(info: CpuInfo, dtype: str = "fp32",
             cores: int | None = None) -> tuple[PeakEntry | None, str]:
    """(peak, reason): the entry when defensible, else None and why (pure function)."""
    from .hardware import PeakEntry

    arch = _match(info)
    label = f"{info.model_name or 'CPU'} (family {info.family:#x} model {info.model:#x})"
    if arch is None:
        return None, (f"no defensible FLOP/cycle figure for {label}: the FMA-unit count of "
                      "this microarchitecture is not in stepscope's table; pass --peak-tflops")
    if dtype != "fp32":
        return None, (f"no defensible {dtype} peak for {arch.name}: vendors publish no "
                      f"per-cycle {dtype} throughput for it; pass --peak-tflops "
                      f"(the fp32 figure is not a {dtype} peak)")
    mhz, clock_src = ((info.max_mhz, "cpufreq cpuinfo_max_freq") if info.max_mhz
                      else (info.mhz, '/proc/cpuinfo "cpu MHz"'))
    if not mhz:
        return None, f"no clock readable for {label}; pass --peak-tflops"
    # SMT siblings share a core's FMA units: never count more cores than are physically there.
    physical = max(1, info.cpus // info.threads_per_core)
    n_cores = min(cores, physical) if cores is not None and cores > 0 else physical
    flops = n_cores * arch.fp32_flop_per_cycle * mhz * 1e6
    source = (f"{arch.source}; x {mhz:.0f} MHz ({clock_src}) x {n_cores} cores "
              f"(sched_getaffinity / threads per core)")
    note = ("clock as reported; turbo above it or AVX-512 down-clocking moves the real peak"
            if clock_src.startswith("/proc") else "maximum clock; sustained may be lower")
    return PeakEntry(device=arch.name, dtype="fp32", flops=flops, source=source,
                     note=note), ""


def host_cpu_peak(dtype: str = "fp32", cores: int | None = None) -> PeakEntry | None:
    """Peak FLOP/s of this machine's CPU for ``dtype``, or None when not defensible."""
    return cpu_peak(read_cpuinfo(), dtype, cores)[0]


def explain_host_cpu_peak(dtype: str = "fp32", cores: int | None = None) -> str:
    """Why :func:`host_cpu_peak` returned None ('' when it did not)."""
    return cpu_peak(read_cpuinfo(), dtype, cores)[1]


def _match(info: CpuInfo) -> _Microarch | None:
    for arch in _MICROARCHS:
        if (info.vendor == arch.vendor and info.family == arch.family
                and any(lo <= info.model <= hi for lo, hi in arch.models)):
            return arch
    return None


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def _kv(line: str) -> tuple[str, str]:
    key, _, value = line.partition(":")
    return key.strip(), value.strip()


def _int(value: str | None) -> int:
    return int(value) if value and re.fullmatch(r"\d+", value) else 0


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None
