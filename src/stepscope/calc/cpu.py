"""Peak FLOP/s of this machine's CPU, for MFU on CPU: only where it can be defended.

peak = cores x FLOP/cycle/core x clock, from host facts the caller passes in (a pure module:
:func:`stepscope.record.host.cpu_facts` reads them; the CLI and the adapters resolve "cpu"), where

* FLOP/cycle/core = FMA units x SIMD lanes x 2 (an FMA is a multiply and an add). It is
  known per microarchitecture, which is identified from the vendor's CPUID family/model (the
  "model name" in VMs is often just "AMD EPYC"), never from the instruction-set flags alone:
  the same AVX-512 flags run on one or two 512-bit FMA units (Intel Xeon by SKU) or on two
  256-bit units double-pumped (AMD Zen 4).
* clock: one that can be defended as *at least* the real one, so a CPU MFU is never
  overstated (a peak too low inflates MFU). In order: a clock the caller gives (measured, or the
  known all-core sustained clock: ``--cpu-clock-ghz``); the kernel's cpufreq
  ``cpuinfo_max_freq`` (the highest clock any core may run at); else -- VMs expose no cpufreq,
  and /proc/cpuinfo "cpu MHz" is the nominal clock, which boost exceeds -- the highest boost
  clock published for any SKU of the identified microarchitecture. The entry names which
  (:attr:`PeakEntry.note`) and, for the last, what the nominal clock would give.
* cores = the cores the run used: ``min(threads, physical cores)`` where threads is the
  framework's intra-op thread count when known (torch.get_num_threads()), and physical cores
  are the CPUs the process may run on (sched_getaffinity) divided by threads per core (SMT
  siblings share FMA units). The same rule in ``stepscope run`` and ``stepscope mfu``.

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

This machine (2025-11 sandbox): "AMD EPYC", family 26 (1Ah) model 2, 2 cores, 2596 MHz
nominal, no cpufreq -> clock ceiling 5.0 GHz (EPYC 9005) -> fp32 peak 2 x 64 x 5.0e9 =
640 GFLOP/s (332.3 at the nominal clock: MFU against that would be up to 1.93x higher).

Example::

    info = parse_cpuinfo(Path("/proc/cpuinfo").read_text(), max_freq_khz=None, cpus=2)
    entry, why = cpu_peak(info, "fp32", cores=2)    # (PeakEntry(...), "") or (None, why)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .hardware import PeakEntry

__all__ = ["CpuInfo", "parse_cpuinfo", "cpu_peak", "host_cpu_peak", "cores_used"]


@dataclass(frozen=True)
class _Microarch:
    name: str
    vendor: str
    family: int
    models: tuple[tuple[int, int], ...]
    fp32_flop_per_cycle: int
    source: str
    boost_ceiling_mhz: float
    boost_source: str


_MICROARCHS = (
    _Microarch("AMD Zen 5 server (EPYC 9005)", "AuthenticAMD", 0x1A, ((0x00, 0x1F),), 64,
               "AMD Software Optimization Guide for Zen 5 (pub. 58455): two 512-bit FMA "
               "pipes -> 2 FMA x 16 fp32 lanes x 2 FLOP = 64 FLOP/cycle/core",
               5000.0, "highest EPYC 9005 boost: EPYC 9175F 'up to 5.0 GHz' (AMD product page)"),
    _Microarch("AMD Zen 4 (EPYC 9004)", "AuthenticAMD", 0x19, ((0x10, 0x1F), (0xA0, 0xAF)), 32,
               "AMD Software Optimization Guide for Family 19h: two 256-bit FMA pipes, "
               "AVX-512 double-pumped -> 2 x 8 x 2 = 32 FLOP/cycle/core",
               4400.0, "highest EPYC 9004 boost: EPYC 9174F 'up to 4.4 GHz' (AMD product page)"),
    _Microarch("AMD Zen 3 (EPYC 7003)", "AuthenticAMD", 0x19, ((0x00, 0x0F),), 32,
               "AMD Software Optimization Guide for Family 19h: two 256-bit FMA pipes "
               "-> 2 x 8 x 2 = 32 FLOP/cycle/core",
               4100.0, "highest EPYC 7003 boost: EPYC 72F3 'up to 4.1 GHz' (AMD product page)"),
)


@dataclass(frozen=True)
class CpuInfo:
    """Host facts the peak needs (read at the edge: :func:`stepscope.record.host.cpu_facts`).

    ``cpus``: logical CPUs the process may run on (sched_getaffinity).
    """

    vendor: str
    family: int
    model: int
    model_name: str
    mhz: float | None
    max_mhz: float | None
    threads_per_core: int
    cpus: int


def parse_cpuinfo(cpuinfo_text: str, max_freq_khz: str | None, cpus: int) -> CpuInfo:
    """Parse /proc/cpuinfo text (first processor) and the cpufreq maximum (kHz text)."""
    first = cpuinfo_text.split("\n\n")[0]
    fields = dict(_kv(line) for line in first.splitlines() if ":" in line)
    siblings, cores = _int(fields.get("siblings")), _int(fields.get("cpu cores"))
    tpc = max(1, siblings // cores) if siblings and cores else 1
    mhz = _float(fields.get("cpu MHz"))
    max_khz = _float(max_freq_khz.strip()) if max_freq_khz else None
    max_mhz = max_khz / 1000.0 if max_khz else None
    return CpuInfo(vendor=fields.get("vendor_id", ""), family=_int(fields.get("cpu family")),
                   model=_int(fields.get("model")), model_name=fields.get("model name", ""),
                   mhz=mhz, max_mhz=max_mhz, threads_per_core=tpc, cpus=max(1, cpus))


def cores_used(info: CpuInfo, threads: int | None = None) -> tuple[int, str]:
    """(cores, how): min(threads, physical cores the process may use) and how it was found."""
    physical = max(1, info.cpus // info.threads_per_core)
    allowed = (f"{info.cpus} CPUs allowed by sched_getaffinity / {info.threads_per_core} "
               "threads per core")
    if threads is not None and threads > 0 and threads < physical:
        return threads, f"{threads} intra-op threads (of {physical} cores: {allowed})"
    return physical, allowed


def cpu_peak(info: CpuInfo, dtype: str = "fp32", cores: int | None = None,
             clock_mhz: float | None = None) -> tuple[PeakEntry | None, str]:
    """(peak, reason): the entry when defensible, else None and why (pure function).

    ``cores``: threads the run used (capped at the physical cores); ``clock_mhz``: a clock
    the caller measured or knows (all-core sustained); see the module docstring.
    """
    arch = _match(info)
    label = f"{info.model_name or 'CPU'} (family {info.family:#x} model {info.model:#x})"
    if arch is None:
        return None, (f"no defensible FLOP/cycle figure for {label}: the FMA-unit count of "
                      "this microarchitecture is not in stepscope's table; pass --peak-tflops")
    if dtype != "fp32":
        return None, (f"no defensible {dtype} peak for {arch.name}: vendors publish no "
                      f"per-cycle {dtype} throughput for it; pass --peak-tflops "
                      f"(the fp32 figure is not a {dtype} peak)")
    mhz, clock, note = _clock(info, arch, clock_mhz)
    n_cores, how = cores_used(info, cores)
    flops = n_cores * arch.fp32_flop_per_cycle * mhz * 1e6
    if clock == "boost ceiling" and info.mhz:
        note += (f"; at the nominal {info.mhz:.0f} MHz the peak would be "
                 f"{flops * info.mhz / mhz / 1e9:.1f} GFLOP/s (MFU up to "
                 f"{mhz / info.mhz:.2f}x higher)")
    source = (f"{arch.source}; x {mhz:.0f} MHz ({clock}) x {n_cores} cores ({how})")
    return PeakEntry(device=arch.name, dtype="fp32", flops=flops, source=source,
                     note=note), ""


def host_cpu_peak(info: CpuInfo, dtype: str = "fp32", cores: int | None = None,
                  clock_mhz: float | None = None) -> PeakEntry | None:
    """Peak FLOP/s of the CPU these facts describe, or None when not defensible."""
    return cpu_peak(info, dtype, cores, clock_mhz)[0]


def _clock(info: CpuInfo, arch: _Microarch, given: float | None) -> tuple[float, str, str]:
    """(MHz, which clock, note): never below the real clock, so MFU is never overstated."""
    if given:
        return given, "given clock", "clock given by the caller (measured or all-core)"
    if info.max_mhz:
        return info.max_mhz, "cpufreq cpuinfo_max_freq", ("the kernel's maximum clock: "
                                                          "sustained clocks are lower, so MFU "
                                                          "is a lower bound")
    return arch.boost_ceiling_mhz, "boost ceiling", (
        f"no cpufreq (a VM?): {arch.boost_source}, an upper bound on this core's clock, so "
        "MFU is a lower bound; pass --cpu-clock-ghz with a measured clock")


def _match(info: CpuInfo) -> _Microarch | None:
    for arch in _MICROARCHS:
        if (info.vendor == arch.vendor and info.family == arch.family
                and any(lo <= info.model <= hi for lo, hi in arch.models)):
            return arch
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
