"""The Kineto reader on real traces (../shared/data) and on small written ones."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from stepscope.errors import TraceFormatError
from stepscope.schema import EVENT_KINDS
from stepscope.traces import detect_format, kineto, read_trace
from support.traces import cpu_step_events, write_trace


def _kinds(t) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return dict(zip(EVENT_KINDS, np.bincount(t.kind, minlength=len(EVENT_KINDS)).tolist(),
                    strict=True))


def test_cpu_gloo_trace(shared_data: Path) -> None:
    t0, t1 = read_trace(shared_data / "traces/kineto-cpu/ddp2_gloo_basic")
    assert (t0.meta["rank"], t1.meta["rank"]) == (0, 1)
    assert _kinds(t0) == {"compute": 0, "comm": 21, "memcpy": 0, "data": 3, "cpu": 11455,
                          "step": 3, "phase": 18}
    assert sorted(t0.meta["steps"]) == [2, 3, 4]
    assert t0.meta["comm_threads"] == [21320, 21321]  # both pt_gloo_runloop threads
    assert t0.meta["ts_is_float"] is True
    # ns decimals survive: some start times are not whole microseconds.
    assert np.any(t0.start_us != np.round(t0.start_us))
    comm = t0.kind == EVENT_KINDS.index("comm")
    assert set(np.isin(t0.stream[comm], t0.meta["comm_threads"])) == {True}


def test_gpu_trace_links_kernels_to_launches_and_steps(shared_data: Path) -> None:
    (t,) = read_trace(shared_data / "traces/kineto-gpu/nccl_parser_config")
    k = _kinds(t)
    assert (k["compute"], k["comm"], k["memcpy"], k["step"]) == (2679, 21, 1074, 3)
    dev = t.extra["on_device"].astype(bool) & np.isin(t.kind, [0, 1, 2])
    linked = np.isfinite(t.extra["launch_us"]) & dev
    assert linked.sum() == dev.sum()  # every kernel/memcpy found its cudaLaunch*
    queue = t.start_us[linked] - t.extra["launch_us"][linked]
    assert queue.min() > 0  # a kernel starts after its launch call began
    assert set(t.step[dev].tolist()) <= {-1, 4, 5, 6}


def test_amd_rocm_trace(shared_data: Path) -> None:
    (t,) = read_trace(shared_data / "traces/kineto-gpu/amd_mi250")
    assert _kinds(t)["compute"] == 14 and t.meta["device_names"][0] == "AMD Radeon Graphics"
    assert np.isfinite(t.extra["launch_us"]).sum() == 16  # hipLaunchKernel correlations


@pytest.mark.parametrize("name", [
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)",
    "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)",
    "void ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
    "ncclAllReduceRingLLKernel_sum_f32", "rcclGenericKernel", "mscclKernel_Sum_f32_LL",
    "NCCLKERNEL_SendRecv"])
def test_comm_kernel_spellings(name: str) -> None:
    assert kineto.is_comm_kernel(name)


@pytest.mark.parametrize("name", ["void at::native::vectorized_elementwise_kernel<4>",
                                  "Memcpy DtoD (Device -> Device)", "sgemm_128x64_nn"])
def test_not_comm_kernels(name: str) -> None:
    assert not kineto.is_comm_kernel(name)


def test_gz_plain_compact_and_streamed_decodes_agree(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    events = [e for k in range(40) for e in cpu_step_events(offset=100.0 * k, step=k)]
    plain = read_trace(write_trace(tmp_path / "a.json", events))[0]
    gz = read_trace(write_trace(tmp_path / "b.json.gz", events))[0]
    compact = read_trace(write_trace(tmp_path / "c.json", events, indent=False))[0]
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 512)  # force many chunks
    whole_parses: list[int] = []
    real_whole = kineto._whole

    def counting_whole(*args, **kwargs):  # type: ignore[no-untyped-def]
        whole_parses.append(1)
        return real_whole(*args, **kwargs)
    monkeypatch.setattr(kineto, "_whole", counting_whole)
    streamed = kineto.read(tmp_path / "a.json")
    streamed_gz = kineto.read(tmp_path / "b.json.gz")
    assert whole_parses == []  # the chunked path framed every chunk itself
    for other in (gz, compact, streamed, streamed_gz):
        assert len(other) == len(plain) == 360
        assert np.array_equal(other.start_us, plain.start_us)
        assert [other.names[i] for i in other.name] == [plain.names[i] for i in plain.name]
        assert other.meta["steps"] == plain.meta["steps"]


def test_detect_format(shared_data: Path, tmp_path: Path) -> None:
    assert detect_format(shared_data / "traces/kineto-gpu/amd_mi250") == "kineto"
    assert detect_format(shared_data / "traces/mindspore-cpu/dp2_cpu_msrun") == "mindspore"
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(TraceFormatError, match="not a recognised profiler trace"):
        detect_format(tmp_path / "x.txt")
    with pytest.raises(TraceFormatError, match="no such file"):
        read_trace(tmp_path / "missing.json")


def test_broken_files_name_the_file(tmp_path: Path) -> None:
    p = tmp_path / "t.json.gz"
    write_trace(p, cpu_step_events())
    p.write_bytes(p.read_bytes()[:-20])  # truncated gzip
    with pytest.raises(TraceFormatError, match=str(p)):
        kineto.read(p)
    q = tmp_path / "u.json"
    q.write_bytes(gzip.decompress(gzip.compress(b'{"traceEvents": [{"ph": "X", "ts": [1]')))
    with pytest.raises(TraceFormatError, match="u.json"):
        kineto.read(q)


@pytest.mark.xdist_group("trace_cpu")
def test_cpu_fixture_numbers_from_its_readme(shared_data: Path) -> None:
    """../shared/data/traces/kineto-cpu/README.md lists a per-step breakdown (ms, union of
    intervals); the step rows reproduce it to 0.1 ms."""
    from stepscope.analysis.trace.breakdown import analyze
    report = analyze(read_trace(shared_data / "traces/kineto-cpu/ddp2_gloo_full"))
    readme = {  # (rank, step): dur, compute, comm, overlap, exposed comm, data, idle
        (0, 2): (1093.6, 989.7, 338.2, 300.4, 37.7, 30.9, 35.5),
        (0, 3): (1153.3, 912.8, 494.1, 306.8, 187.3, 30.8, 22.7),
        (1, 2): (1081.3, 1019.2, 129.8, 119.5, 10.3, 30.9, 21.1),
    }
    for (rank, step), want in readme.items():
        row = next(r for r in report.ranks[rank].steps if r.step == step)
        got = (row.step_time_us, row.compute_us, row.comm_us, row.comm_overlapped_us,
               row.comm_exposed_us, row.data_us, row.no_activity_us)
        assert [round(g / 1000, 1) for g in got] == pytest.approx(list(want), abs=0.11)


def test_parallel_and_serial_reads_agree(shared_data: Path) -> None:
    d = shared_data / "traces/kineto-cpu/ddp2_gloo_basic"
    serial = read_trace(d, processes=1)
    parallel = read_trace(d, processes=2)
    assert [t.meta["rank"] for t in parallel] == [0, 1]
    for a, b in zip(serial, parallel, strict=True):
        assert np.array_equal(a.start_us, b.start_us) and a.names == b.names
