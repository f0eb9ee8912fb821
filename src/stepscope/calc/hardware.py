"""Dense peak FLOP/s per device and dtype, each with its source; lookup by reported names.

Every figure is *dense*. NVIDIA datasheets print tensor-core figures "with sparsity"
(2:4 structured sparsity doubles them, footnoted with an asterisk); those are halved here, and
a dense figure is never mixed with a sparse one: feeding 1979e12 for an H100 halves MFU
(foundation-model-stack/fms-fsdp, GitHub issues/89: 24.3% vs 46%). Unknown device or dtype
-> ``None`` and :func:`explain_miss` says why and lists close names; the CLI raises
:class:`~stepscope.errors.UnknownDeviceError` (via :func:`require_peak`). Nothing is guessed.

Names are matched as frameworks report them: ``torch.cuda.get_device_name()`` ("NVIDIA H100
80GB HBM3", "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB", "AMD Instinct MI300X"),
``torch_npu``/MindSpore/``npu-smi`` ("Ascend910B2"), JAX/torch_xla device kinds ("TPU v5
lite"). CPU peaks depend on the microarchitecture and clock of the machine: see
:mod:`stepscope.calc.cpu` (pure, from host facts) and :func:`stepscope.record.host.cpu_peak_here`
(which reads them); "cpu" is resolved there, never here.

Example::

    lookup_peak("NVIDIA H100 80GB HBM3", "bf16").flops   # 989.5e12
"""

from __future__ import annotations

import difflib
import math
import os
import re
from dataclasses import dataclass, field

from ..errors import UnknownDeviceError

__all__ = [
    "PeakEntry",
    "DeviceSpec",
    "DEVICES",
    "DTYPES",
    "normalize_dtype",
    "lookup_peak",
    "explain_miss",
    "require_peak",
    "is_host_cpu",
    "given_peak",
    "PEAK_ENV",
]

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
_DTYPE_ALIASES = {
    "float32": "fp32", "float": "fp32", "f32": "fp32", "tf32": "tf32", "bfloat16": "bf16",
    "bf16": "bf16", "float16": "fp16", "half": "fp16", "f16": "fp16", "fp16": "fp16",
    "fp32": "fp32", "fp8": "fp8", "float8": "fp8", "e4m3": "fp8", "e5m2": "fp8",
}


@dataclass(frozen=True)
class PeakEntry:
    """One dense peak: FLOP/s of one ``device`` in one ``dtype``, and where it comes from."""

    device: str
    dtype: str
    flops: float
    source: str
    note: str = ""


@dataclass(frozen=True)
class DeviceSpec:
    """A table row: canonical name, name patterns (on normalized names), dense peaks."""

    name: str
    patterns: tuple[str, ...]
    peaks: dict[str, float]
    source: str
    note: str = ""
    missing: dict[str, str] = field(default_factory=dict)  # dtype -> why there is no figure


_SPARSE_HALVED = "tensor-core figures printed 'with sparsity' halved to dense"

# Patterns run on the normalized name (lower case, vendor words dropped, separators -> space).
DEVICES: tuple[DeviceSpec, ...] = (
    DeviceSpec("H100 NVL", (r"\bh100 nvl\b",),
               {"fp32": 60e12, "tf32": 417.5e12, "bf16": 835.5e12, "fp16": 835.5e12,
                "fp8": 1670.5e12},
               f"NVIDIA H100 NVL datasheet (2023); {_SPARSE_HALVED}",
               "torchtitan uses 835e12 for bf16"),
    DeviceSpec("H100 PCIe", (r"\bh100 pcie\b", r"\bh100 .*pcie\b"),
               {"fp32": 51e12, "tf32": 378e12, "bf16": 756.5e12, "fp16": 756.5e12,
                "fp8": 1513e12},
               f"NVIDIA H100 PCIe datasheet (2023); {_SPARSE_HALVED}",
               "torchtitan uses 756e12 for bf16"),
    DeviceSpec("H100 SXM", (r"\bh100\b",),
               {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12, "fp16": 989.5e12,
                "fp8": 1979e12},
               f"NVIDIA H100 SXM5 datasheet (2023); {_SPARSE_HALVED}",
               "'NVIDIA H100 80GB HBM3' is the SXM5 part; torchtitan uses 989e12, the "
               "Hopper whitepaper 989.4e12 for bf16"),
    DeviceSpec("H800 PCIe", (r"\bh800 pcie\b", r"\bh800 .*pcie\b"),
               {"fp32": 51e12, "tf32": 378e12, "bf16": 756.5e12, "fp16": 756.5e12,
                "fp8": 1513e12},
               f"NVIDIA H800 PCIe datasheet (compute as H100 PCIe); {_SPARSE_HALVED}"),
    DeviceSpec("H800 SXM", (r"\bh800\b",),
               {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12, "fp16": 989.5e12,
                "fp8": 1979e12},
               f"NVIDIA H800 SXM5 datasheet (compute as H100 SXM5; reduced NVLink and "
               f"FP64); {_SPARSE_HALVED}"),
    DeviceSpec("H200 NVL", (r"\bh200 nvl\b",),
               {"fp32": 60e12, "tf32": 417.5e12, "bf16": 835.5e12, "fp16": 835.5e12,
                "fp8": 1670.5e12},
               f"NVIDIA H200 datasheet (2024), H200 NVL column; {_SPARSE_HALVED}"),
    DeviceSpec("H200 SXM", (r"\bh200\b",),
               {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12, "fp16": 989.5e12,
                "fp8": 1979e12},
               f"NVIDIA H200 datasheet (2024), H200 SXM column; {_SPARSE_HALVED}"),
    DeviceSpec("A800", (r"\ba800\b",),
               {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
               "NVIDIA A800 40GB/80GB datasheet (compute as A100); dense tensor-core figures",
               missing={"fp8": "Ampere has no FP8 tensor cores"}),
    DeviceSpec("A100", (r"\ba100\b",),
               {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
               "NVIDIA A100 datasheet (2021), SXM4 and PCIe alike; dense tensor-core figures "
               "(sparse = 2x, asterisked)",
               missing={"fp8": "Ampere has no FP8 tensor cores"}),
    DeviceSpec("V100S PCIe", (r"\bv100s\b",),
               {"fp32": 16.4e12, "fp16": 130e12},
               "NVIDIA V100S datasheet: 130 TFLOPS tensor fp16, 16.4 TFLOPS fp32",
               missing={"bf16": "Volta tensor cores have no bf16; use fp16",
                        "tf32": "TF32 arrived with Ampere", "fp8": "no FP8 on Volta"}),
    DeviceSpec("V100 PCIe", (r"\bv100 pcie\b", r"\bv100 .*pcie\b"),
               {"fp32": 14e12, "fp16": 112e12},
               "NVIDIA V100 datasheet (2020), PCIe column: 112 TFLOPS tensor fp16, 14 fp32",
               missing={"bf16": "Volta tensor cores have no bf16; use fp16",
                        "tf32": "TF32 arrived with Ampere", "fp8": "no FP8 on Volta"}),
    DeviceSpec("V100 SXM2", (r"\bv100\b",),
               {"fp32": 15.7e12, "fp16": 125e12},
               "NVIDIA V100 datasheet (2020), SXM2 column: 125 TFLOPS tensor fp16, 15.7 fp32",
               missing={"bf16": "Volta tensor cores have no bf16; use fp16",
                        "tf32": "TF32 arrived with Ampere", "fp8": "no FP8 on Volta"}),
    DeviceSpec("L40S", (r"\bl40s\b",),
               {"fp32": 91.6e12, "tf32": 183e12, "bf16": 362.05e12, "fp16": 362.05e12,
                "fp8": 733e12},
               "NVIDIA L40S datasheet (2023): dense figures as printed beside the "
               "asterisked sparse ones (bf16 362.05 | 733*)",
               "torchtitan uses 362e12 for bf16"),
    DeviceSpec("GB200", (r"\bgb200\b",),
               {"fp32": 80e12, "tf32": 1250e12, "bf16": 2500e12, "fp16": 2500e12,
                "fp8": 5000e12},
               "NVIDIA GB200 NVL72 datasheet (2024): per rack of 72 GPUs FP16/BF16 360 PF*, "
               f"FP8 720 PF*, TF32 180 PF*, FP32 5,760 TF; per GPU, {_SPARSE_HALVED}"),
    DeviceSpec("B200", (r"\bb200\b",),
               {"fp32": 75e12, "tf32": 1125e12, "bf16": 2250e12, "fp16": 2250e12,
                "fp8": 4500e12},
               "NVIDIA HGX B200 datasheet (2024): per 8 GPUs FP16/BF16 36 PF*, FP8 72 PF*, "
               f"TF32 18 PF*, FP32 600 TF; per GPU, {_SPARSE_HALVED}",
               "torchtitan uses 2.25e15 for bf16"),
    DeviceSpec("L4", (r"\bl4\b",),
               {"fp32": 30.3e12, "tf32": 60e12, "bf16": 121e12, "fp16": 121e12,
                "fp8": 242.5e12},
               f"NVIDIA L4 datasheet (2023): BF16 242*, FP8 485*, TF32 120*; {_SPARSE_HALVED}"),
    DeviceSpec("A10", (r"\ba10\b",),
               {"fp32": 31.2e12, "tf32": 62.5e12, "bf16": 125e12, "fp16": 125e12},
               "NVIDIA A10 datasheet (2021): dense figures as printed beside the asterisked "
               "sparse ones (BF16 125 | 250*, TF32 62.5 | 125*)",
               "the AWS A10G is another part with no NVIDIA datasheet: pass --peak-tflops",
               missing={"fp8": "Ampere has no FP8 tensor cores"}),
    DeviceSpec("T4", (r"\bt4\b",),
               {"fp32": 8.1e12, "fp16": 65e12},
               "NVIDIA T4 datasheet (2019): mixed-precision FP16/FP32 tensor 65 TFLOPS, "
               "FP32 8.1 TFLOPS (Turing has no sparsity)",
               missing={"bf16": "Turing tensor cores have no bf16; use fp16",
                        "tf32": "TF32 arrived with Ampere", "fp8": "no FP8 on Turing"}),
    DeviceSpec("MI355X", (r"\bmi355x\b",),
               {"fp32": 157.3e12, "bf16": 2516.6e12, "fp16": 2516.6e12, "fp8": 5033.2e12},
               "AMD Instinct MI355X datasheet (2025): dense FP16/BF16 2.5 PF, FP8 5.0 PF "
               "(structured sparsity doubles them); FP32 157.3 TF",
               missing={"tf32": "no TF32 figure in the MI355X datasheet"}),
    DeviceSpec("MI325X", (r"\bmi325x\b",),
               {"fp32": 163.4e12, "tf32": 653.7e12, "bf16": 1307.4e12, "fp16": 1307.4e12,
                "fp8": 2614.9e12},
               "AMD Instinct MI325X datasheet (2024): dense matrix peaks as MI300X (sparsity "
               "doubles them); fp32 is the matrix figure"),
    DeviceSpec("MI250X", (r"\bmi250x\b",),
               {"fp32": 95.7e12, "bf16": 383e12, "fp16": 383e12},
               "AMD Instinct MI250X datasheet (2021): FP16/BF16 383 TF, FP32 matrix 95.7 TF "
               "(CDNA2 has no sparsity)",
               missing={"tf32": "CDNA2 has no TF32", "fp8": "CDNA2 has no FP8"}),
    DeviceSpec("MI300X", (r"\bmi300x\b",),
               {"fp32": 163.4e12, "tf32": 653.7e12, "bf16": 1307.4e12, "fp16": 1307.4e12,
                "fp8": 2614.9e12},
               "AMD Instinct MI300X datasheet (2023): dense matrix peaks (sparsity doubles "
               "them); fp32 is the matrix figure",
               "torchtitan uses 1300e12 for bf16"),
    DeviceSpec("TPU v4", (r"\btpu v4\b",), {"bf16": 275e12},
               "Google Cloud TPU v4 documentation: 275 TFLOPS bf16 per chip (PaLM used the same)",
               missing={"fp32": "no published fp32 matrix peak; MXUs compute in bf16"}),
    DeviceSpec("TPU v5e", (r"\btpu v5e\b", r"\btpu v5 ?lite\b", r"\btpu v5litepod\b"),
               {"bf16": 197e12},
               "Google Cloud TPU v5e documentation: 197 TFLOPS bf16 per chip",
               missing={"fp32": "no published fp32 matrix peak; MXUs compute in bf16"}),
    DeviceSpec("TPU v5p", (r"\btpu v5p\b", r"\btpu v5$"),
               {"bf16": 459e12},
               "Google Cloud TPU v5p documentation: 459 TFLOPS bf16 per chip",
               "JAX reports v5p as 'TPU v5'",
               missing={"fp32": "no published fp32 matrix peak; MXUs compute in bf16"}),
    DeviceSpec("TPU v6e", (r"\btpu v6e\b", r"\btpu v6 ?lite\b"), {"bf16": 918e12},
               "Google Cloud TPU v6e (Trillium) documentation: 918 TFLOPS bf16 per chip",
               missing={"fp32": "no published fp32 matrix peak; MXUs compute in bf16"}),
    DeviceSpec("Ascend 910", (r"\bascend ?910a?$", r"\bascend ?910 ?a\b"),
               {"fp16": 256e12},
               "Huawei Ascend 910 launch (Aug 2019): 256 TFLOPS fp16, 512 TOPS int8",
               missing={"bf16": "the first-generation Ascend 910 has no published bf16 peak",
                        "fp32": "no published fp32 peak"}),
)

# Devices we know of but hold no defensible figure for: name pattern -> reason.
_NO_FIRST_PARTY = (
    (r"\bh20\b", "NVIDIA publishes no public datasheet for the H20 (a China-market Hopper "
     "part, not the H200; the figures in circulation come from partner briefs and the press); "
     "pass the dense figure for your part with --peak-tflops"),
    (r"\bascend ?910 ?(b|c|pro|_?9)", "Huawei publishes no first-party dense peak for the "
     "Ascend 910B/910C family (the figures in circulation are third-party and differ by "
     "sub-model 910B1..B4); confirm the figure for your part with your vendor and pass it "
     "with --peak-tflops"),
)


def _dtype_key(dtype: str) -> str | None:
    key = dtype.strip().lower().replace("torch.", "").replace("mindspore.", "")
    return _DTYPE_ALIASES.get(key)


def normalize_dtype(dtype: str) -> str:
    """Canonical dtype name (fp32, tf32, bf16, fp16, fp8) or UnknownDeviceError."""
    key = _dtype_key(dtype)
    if key is None:
        raise UnknownDeviceError(f"unknown dtype {dtype!r}; expected one of "
                                 f"{', '.join(DTYPES)}")
    return key


def _normalize_name(name: str) -> str:
    s = name.lower()
    s = re.sub(r"\b(nvidia|tesla|amd|instinct|google|huawei|geforce)\b", " ", s)
    s = re.sub(r"[-_/,()]+", " ", s)
    s = re.sub(r"ascend\s*(\d)", r"ascend\1", s)
    return re.sub(r"\s+", " ", s).strip()


def _find_device(name: str) -> DeviceSpec | None:
    norm = _normalize_name(name)
    for dev in DEVICES:
        if any(re.search(p, norm) for p in dev.patterns):
            return dev
    return None


def lookup_peak(device_name: str, dtype: str = "bf16") -> PeakEntry | None:
    """Dense peak of ``device_name`` in ``dtype``, or None (then see :func:`explain_miss`).

    Example::

        lookup_peak("NVIDIA A100-SXM4-80GB", "bf16").flops   # 312e12
        lookup_peak("Ascend910B2", "fp16")                   # None: no first-party figure
    """
    dev = _find_device(device_name)
    dt = _dtype_key(dtype)
    if dev is None or dt is None or dt not in dev.peaks:
        return None
    return PeakEntry(device=dev.name, dtype=dt, flops=dev.peaks[dt], source=dev.source,
                     note=dev.note)


def explain_miss(device_name: str, dtype: str = "bf16") -> str:
    """Why :func:`lookup_peak` found nothing, with close names and what to do."""
    norm = _normalize_name(device_name)
    for pattern, reason in _NO_FIRST_PARTY:
        if re.search(pattern, norm):
            return f"no peak for {device_name!r}: {reason}"
    dt = _dtype_key(dtype)
    if dt is None:
        return f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}"
    dev = _find_device(device_name)
    if dev is not None:
        why = dev.missing.get(dt, "no published dense figure in this dtype")
        have = ", ".join(dev.peaks)
        return (f"{dev.name} has no {dt} peak ({why}); known dtypes for it: {have}; "
                "or pass --peak-tflops")
    if re.search(r"\b(epyc|xeon|cpu|ryzen|core i\d|arm|neoverse|kunpeng)\b", norm):
        return (f"{device_name!r} is a CPU: its peak depends on the microarchitecture and the "
                "clock of the machine; use --device cpu on that machine (host_cpu_peak) "
                "or pass --peak-tflops")
    names = [d.name for d in DEVICES]
    by_norm = {_normalize_name(n): n for n in names}
    close = difflib.get_close_matches(norm, list(by_norm), n=4, cutoff=0.5)
    close_names = [by_norm[c] for c in close]
    hint = f"close names: {', '.join(close_names)}; " if close_names else ""
    return (f"unknown device {device_name!r}: {hint}known devices: {', '.join(names)}; "
            "pass --peak-tflops P to give the dense peak per device")


def is_host_cpu(device_name: str) -> bool:
    """True for the names that mean "this machine's CPU" (resolved by the caller)."""
    return device_name.strip().lower() in ("cpu", "host", "host-cpu")


def require_peak(device_name: str, dtype: str = "bf16") -> PeakEntry:
    """:func:`lookup_peak` that raises :class:`UnknownDeviceError` with the explanation.

    "cpu" needs this host's facts: the caller resolves it with
    :func:`stepscope.record.host.cpu_peak_here` (a pure calculator reads no /proc).
    """
    if is_host_cpu(device_name):
        raise UnknownDeviceError("the 'cpu' peak depends on this host (microarchitecture, "
                                 "clock, cores): resolve it with "
                                 "stepscope.record.host.cpu_peak_here(), or pass --peak-tflops")
    entry = lookup_peak(device_name, dtype)
    if entry is None:
        raise UnknownDeviceError(explain_miss(device_name, dtype))
    return entry


# The peak a user gives a recorded run (`stepscope run --peak-tflops P` sets it for the
# command; a script using a callback may set it itself): TFLOP/s per device.
PEAK_ENV = "STEPSCOPE_PEAK_TFLOPS"


def given_peak(dtype: str = "fp32") -> PeakEntry | None:
    """The dense peak per device the user gave in ``$STEPSCOPE_PEAK_TFLOPS``, or None when
    none (or not a positive number: a training process never fails on it, and MFU then
    falls back to the device table). It stands before the table for any device: on a CPU
    or accelerator the table has no defensible figure for, it is the only way to an MFU."""
    text = os.environ.get(PEAK_ENV, "").strip()
    try:
        tflops = float(text)
    except ValueError:
        return None
    if not (tflops > 0 and math.isfinite(tflops)):
        return None
    return PeakEntry(device="given", dtype=_dtype_key(dtype) or dtype, flops=tflops * 1e12,
                     source=f"given: --peak-tflops {text} ({PEAK_ENV})")
