"""Device peak table: lookup by the strings frameworks report, misses explained, CPU peaks."""

from __future__ import annotations

import os

import pytest

from stepscope.calc.cpu import CpuInfo, cores_used, cpu_peak, parse_cpuinfo
from stepscope.calc.hardware import (
    DEVICES,
    DTYPES,
    explain_miss,
    lookup_peak,
    normalize_dtype,
    require_peak,
)
from stepscope.errors import UnknownDeviceError
from stepscope.record.host import cpu_facts, cpu_peak_here

# Strings as torch.cuda.get_device_name() / torch_npu / JAX report them -> table row.
REPORTED = [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H800", "H800 SXM"),
    ("NVIDIA H200", "H200 SXM"),
    ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA A100-SXM4-80GB", "A100"),
    ("NVIDIA A100-SXM4-40GB", "A100"),
    ("NVIDIA A100-PCIE-40GB", "A100"),
    ("NVIDIA A100 80GB PCIe", "A100"),
    ("NVIDIA A800-SXM4-80GB", "A800"),
    ("NVIDIA A800 80GB PCIe", "A800"),
    ("Tesla V100-SXM2-32GB", "V100 SXM2"),
    ("Tesla V100-SXM2-16GB", "V100 SXM2"),
    ("Tesla V100-PCIE-32GB", "V100 PCIe"),
    ("Tesla V100S-PCIE-32GB", "V100S PCIe"),
    ("NVIDIA L40S", "L40S"),
    ("AMD Instinct MI300X", "MI300X"),
    ("AMD Instinct MI300X VF", "MI300X"),
    ("TPU v4", "TPU v4"),
    ("TPU v5 lite", "TPU v5e"),
    ("TPU v5", "TPU v5p"),
    ("Ascend910A", "Ascend 910"),
    ("NVIDIA B200", "B200"),
    ("NVIDIA GB200", "GB200"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA A10", "A10"),
    ("Tesla T4", "T4"),
    ("AMD Instinct MI250X", "MI250X"),
    ("AMD Instinct MI325X", "MI325X"),
    ("AMD Instinct MI355X", "MI355X"),
    ("TPU v6 lite", "TPU v6e"),
]


@pytest.mark.parametrize(("reported", "row"), REPORTED)
def test_lookup_by_reported_name(reported: str, row: str) -> None:
    dtype = "fp16"  # every row above has an fp16 or bf16 figure; fp16 except TPUs
    if row.startswith("TPU"):
        dtype = "bf16"
    entry = lookup_peak(reported, dtype)
    assert entry is not None and entry.device == row
    assert entry.source  # every figure carries its source


def test_every_entry_has_source_and_dense_figures() -> None:
    for dev in DEVICES:
        assert dev.source and dev.peaks
        assert set(dev.peaks) <= set(DTYPES)
        # Dense only: the H100 SXM dense bf16 is 989.5e12, the sparse 1979e12 is never here.
        # (dense bf16/fp16 of the largest part, GB200, is 2.5e15; fp8 twice that)
        assert all(v < (6e15 if dt == "fp8" else 3e15) for dt, v in dev.peaks.items())
    h100 = {d.name: d for d in DEVICES}["H100 SXM"].peaks
    assert h100 == {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12, "fp16": 989.5e12,
                    "fp8": 1979e12}


def test_ascend_910b_needs_confirmation() -> None:
    for name in ("Ascend910B2", "Ascend910B3", "Ascend910B4", "Ascend 910B"):
        assert lookup_peak(name, "bf16") is None
        msg = explain_miss(name, "bf16")
        assert "no first-party" in msg and "--peak-tflops" in msg
    with pytest.raises(UnknownDeviceError, match="--peak-tflops"):
        require_peak("Ascend910B2", "fp16")


def test_similar_names_are_not_guessed() -> None:
    # H20 and GH200 are other parts: never matched to H200 by a loose pattern.
    for name in ("NVIDIA H20", "NVIDIA GH200 480GB", "NVIDIA A10G"):
        assert lookup_peak(name, "bf16") is None, name
    assert "not the H200" in explain_miss("NVIDIA H20", "bf16")
    assert "--peak-tflops" in explain_miss("NVIDIA H20", "bf16")
    assert "no first-party" in explain_miss("Ascend910_9392", "bf16")


def test_unknown_device_lists_close_names() -> None:
    msg = explain_miss("NVIDIA H10", "bf16")
    assert "close names: " in msg and "H100" in msg and "--peak-tflops" in msg
    with pytest.raises(UnknownDeviceError, match="MI300X"):
        require_peak("AMD Instinct MI210", "bf16")


def test_dtype_missing_for_device_is_explained() -> None:
    assert lookup_peak("Tesla V100-SXM2-32GB", "bf16") is None
    assert "no bf16" in explain_miss("Tesla V100-SXM2-32GB", "bf16")
    assert lookup_peak("NVIDIA A100-SXM4-80GB", "fp8") is None
    assert "FP8" in explain_miss("NVIDIA A100-SXM4-80GB", "fp8")
    assert normalize_dtype("torch.bfloat16") == "bf16"
    with pytest.raises(UnknownDeviceError, match="expected one of"):
        normalize_dtype("int3")


def test_cpu_name_points_to_host_peak() -> None:
    assert lookup_peak("AMD EPYC 9654", "fp32") is None
    assert "--device cpu" in explain_miss("AMD EPYC 9654", "fp32")


# The fields of this sandbox's /proc/cpuinfo (a KVM guest of an EPYC 9005): family 26 = 1Ah.
ZEN5_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
cpu MHz\t\t: 2596.120
siblings\t: 2
cpu cores\t: 2
flags\t\t: fma avx2 avx512f avx512_bf16

processor\t: 1
"""


def test_cpu_peak_zen5_from_cpuinfo() -> None:
    info = parse_cpuinfo(ZEN5_CPUINFO, max_freq_khz="", cpus=2)
    entry, why = cpu_peak(info, "fp32")
    assert why == "" and entry is not None
    # No cpufreq (a VM): the nominal 2596 MHz could be below the boosted clock and would
    # overstate MFU, so the EPYC 9005 boost ceiling (5.0 GHz) is used and said.
    assert entry.flops == 2 * 64 * 5.0e9
    assert "58455" in entry.source and "boost ceiling" in entry.source
    assert "9175F" in entry.note and "332.3 GFLOP/s" in entry.note and "1.93x" in entry.note
    # cpufreq maximum wins when the kernel exposes it; threads asked beyond cores are capped.
    info = parse_cpuinfo(ZEN5_CPUINFO, max_freq_khz="3700000\n", cpus=2)
    assert cpu_peak(info, "fp32", cores=8)[0].flops == 2 * 64 * 3.7e9  # type: ignore[union-attr]
    # A clock the caller measured wins over both.
    given = cpu_peak(info, "fp32", clock_mhz=2596.12)[0]
    assert given is not None and given.flops == 2 * 64 * 2596.12e6
    assert "given clock" in given.source


def test_cpu_cores_are_the_threads_the_run_used() -> None:
    info = parse_cpuinfo(ZEN5_CPUINFO, max_freq_khz="", cpus=2)
    assert cores_used(info, 1) == (1, "1 intra-op threads (of 2 cores: 2 CPUs allowed by "
                                      "sched_getaffinity / 1 threads per core)")
    assert cores_used(info, None)[0] == cores_used(info, 2)[0] == cores_used(info, 64)[0] == 2
    one = cpu_peak(info, "fp32", cores=1)[0]
    assert one is not None and one.flops == 64 * 5.0e9 and "x 1 cores" in one.source


def test_cpu_peak_refuses_what_it_cannot_defend() -> None:
    info = parse_cpuinfo(ZEN5_CPUINFO, max_freq_khz="", cpus=2)
    entry, why = cpu_peak(info, "bf16")
    assert entry is None and "--peak-tflops" in why
    intel = CpuInfo(vendor="GenuineIntel", family=6, model=143, model_name="Intel Xeon",
                    mhz=2000.0, max_mhz=None, threads_per_core=2, cpus=8)
    entry, why = cpu_peak(intel, "fp32")
    assert entry is None and "not in stepscope's table" in why
    smt = parse_cpuinfo(ZEN5_CPUINFO.replace("siblings\t: 2", "siblings\t: 4"), "", cpus=4)
    assert cpu_peak(smt, "fp32")[0].flops == 2 * 64 * 5.0e9  # type: ignore[union-attr]


def test_cpu_peak_on_this_machine() -> None:
    entry, why = cpu_peak_here("fp32")
    info = cpu_facts()
    if entry is None:  # another machine: must say why, never guess
        assert why and cpu_peak(info, "fp32")[1] == why
        return
    cores = min(len(os.sched_getaffinity(0)), info.cpus) // info.threads_per_core
    assert entry.flops > 0 and f"x {cores} cores" in entry.source
    assert cpu_peak_here("bf16")[0] is None
    with pytest.raises(UnknownDeviceError, match="cpu_peak_here"):
        require_peak("cpu", "fp32")  # the pure table never reads the host
