"""MindSpore profiler-output reader: real CPU outputs (../shared/data/traces/mindspore-cpu),
Ascend-format files written here, broken input. No MindSpore import needed."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepscope.errors import TraceFormatError
from stepscope.record.crossrank import cross_rank_event, straggler_scores, stragglers
from stepscope.record.losscheck import LossWatch, find_loss
from stepscope.schema import EVENT_KINDS, EventTable
from stepscope.traces import mindspore as msr
from stepscope.traces.mindspore_phases import PHASE_NAMES, annotate, op_phase, phase_busy_us

MS = "traces/mindspore-cpu"
OPS = [EVENT_KINDS.index("compute"), EVENT_KINDS.index("comm")]


def _ops(t: EventTable) -> np.ndarray:
    return np.isin(t.kind, OPS)


def _names(t: EventTable) -> np.ndarray:
    return np.asarray(t.names, dtype=object)[t.name]


def _rank_dir(shared_data: Path, folder: str) -> Path:
    return next((shared_data / MS / folder).glob("*_ascend_ms"))


def _mirror(src: Path, dst: Path, keep: tuple[str, ...]) -> Path:
    """A *_ascend_ms dir holding symlinks to ``keep`` subdirs of ``src`` (read in place)."""
    d = dst / src.name
    d.mkdir(parents=True)
    for sub in keep:
        os.symlink(src / sub, d / sub)
    return d


def test_op_phase_rules() -> None:
    names = [
        "Default/network-WithLossCell/_backbone-TinyLM/blocks-SequentialCell/0-Block/Add-op1",
        "Gradients/Default/network-WithLossCell/_backbone-Dense/Grad_MatMul/MatMul-op0",
        "Default/optimizer-AdamWeightDecay/AdamWeightDecay-op24",
        "Default/optimizer-Momentum/AssignAdd-op0",
        "Default/grad_reducer-DistributedGradReducer/AllReduce-op0",
        "Default/grad_reducer-DistributedGradReducer/Mul-op0",
        "Expand/_SoftmaxBackward/ReduceSum-op1",
        "Expand/_MatMulExt/BroadcastTo-op1",  # not a Broadcast collective
        "Default/MatMul-op0",  # jit function: flat, resolved by position
        "Default/AdamWeightDecay-op12",
        "hcom_allReduce__123_0_1",
        "MatMul",  # PyNative: no scope
    ]
    fwd, bwd, opt, comm = (PHASE_NAMES.index(p) for p in
                           ("forward", "backward", "optimizer", "comm"))
    assert [op_phase(n) for n in names] == [fwd, bwd, opt, opt, comm, bwd, bwd, -1, -2, opt,
                                            comm, -1]


def test_graph_mode_modeltrain_trace(shared_data: Path) -> None:
    [t] = msr.read(shared_data / MS / "tinylm_graph_modeltrain")
    assert int(t.rank[0]) == 0 and t.meta["device"] == "cpu"
    assert t.meta["step_source"].startswith("inferred: 3 steps from op repetition")
    assert t.meta["phase_source"].startswith("inferred from op names")
    ops = _ops(t)
    assert int(ops.sum()) == 858  # lines x occurrences of cpu_op_execute_timestamp_0.txt
    # each step runs every op of the graph once: 286 ops per step
    assert np.bincount(t.step[ops]).tolist() == [286, 286, 286]
    assert _names(t.select(t.kind_mask("step"))).tolist() == ["Step#0", "Step#1", "Step#2"]
    phase = t.extra["phase"]
    assert set(np.unique(phase[ops]).astype(int)) == {0, 1, 2}  # fwd, bwd, opt; no comm
    names = _names(t)
    assert np.all(phase[ops & np.char.startswith(names.astype(str), "Gradients/")] == 1)
    assert np.all(phase[ops & (np.char.find(names.astype(str), "optimizer-") >= 0)] == 2)
    assert any(w.startswith("no communication found (looked for: AllGather")
               for w in t.meta["warnings"])
    busy = phase_busy_us(t)
    for k, row in busy.items():  # busy time per phase never exceeds the step's span
        assert row["forward"] + row["backward"] + row["optimizer"] <= row["step"], k
        assert row["backward"] > row["forward"] > row["optimizer"] > 0


def test_trace_view_and_framework_txt_agree(shared_data: Path, tmp_path: Path) -> None:
    src = _rank_dir(shared_data, "tinylm_graph_modeltrain")
    [a] = msr.read(src)
    [b] = msr.read(_mirror(src, tmp_path, ("FRAMEWORK",)))  # no trace_view.json: .txt
    assert b.meta["source"].endswith("cpu_op_execute_timestamp_0.txt")
    oa, ob = a.select(_ops(a)), b.select(_ops(b))
    ka = sorted(zip(_names(oa).tolist(), oa.start_us.tolist(), strict=True))
    kb = sorted(zip(_names(ob).tolist(), ob.start_us.tolist(), strict=True))
    assert [n for n, _ in ka] == [n for n, _ in kb]
    # MindSpore writes trace_view.json 37 ns later than the .txt it derives it from
    offset = np.array([s for _, s in ka]) - np.array([s for _, s in kb])
    assert np.allclose(offset, 0.037, rtol=0, atol=1e-6)
    assert np.isclose(oa.dur_us.sum(), ob.dur_us.sum(), rtol=0, atol=1e-6)
    assert a.meta["time_origin_us"] == b.meta["time_origin_us"] == 1796028000000000


def test_timestamps_keep_nanoseconds(shared_data: Path) -> None:
    src = _rank_dir(shared_data, "tinylm_graph_modeltrain")
    raw = json.loads((src / "ASCEND_PROFILER_OUTPUT/trace_view.json").read_text())
    first = next(e for e in raw if e["ph"] == "X" and e["pid"] == 2)
    [t] = msr.read(src)
    i = int(np.flatnonzero(_names(t) == first["name"])[0])
    whole, frac = first["ts"].split(".")
    assert t.start_us[i] == pytest.approx(int(whole) - 1796028000000000 + float("0." + frac),
                                          abs=1e-6)


def test_msrun_two_ranks(shared_data: Path) -> None:
    tables = msr.read(shared_data / MS / "dp2_cpu_msrun")
    assert [int(t.rank[0]) for t in tables] == [0, 1]
    for t in tables:
        comm = t.kind_mask("comm")
        assert sorted(set(_names(t)[comm])) == [
            "Default/grad_reducer-DistributedGradReducer/AllReduce-op0",
            "Default/grad_reducer-DistributedGradReducer/AllReduce-op1"]
        assert np.all(t.extra["phase"][comm] == PHASE_NAMES.index("comm"))
        assert np.bincount(t.step[_ops(t)]).tolist() == [13, 13]
        assert t.meta["warnings"] == []


def test_markers_give_the_same_steps_as_inference(shared_data: Path, tmp_path: Path) -> None:
    src = _rank_dir(shared_data, "tinylm_graph_modeltrain")
    [inferred] = msr.read(src)
    origin = inferred.meta["time_origin_us"]
    steps = inferred.select(inferred.kind_mask("step"))
    markers = [{"rank": 0, "step": 10 + int(k), "start_us": origin + s - 1.0,
                "end_us": origin + s + d + 1.0}
               for k, s, d in zip(steps.step, steps.start_us, steps.dur_us, strict=True)]
    d = _mirror(src, tmp_path, ("ASCEND_PROFILER_OUTPUT", "FRAMEWORK"))
    (d / "stepscope_steps.json").write_text(json.dumps({"steps": markers}))
    [marked] = msr.read(d)
    assert marked.meta["step_source"] == "stepscope step markers (stepscope_steps.json)"
    a, b = inferred.select(_ops(inferred)), marked.select(_ops(marked))
    assert (b.step - 10).tolist() == a.step.tolist()


def _write_ascend(d: Path) -> Path:
    """An Ascend-layout output dir. No Ascend output exists on this machine: the files follow
    the column names of MindSpore 2.10's writers (mindspore/profiler/analysis/viewer/
    ascend_{kernel_details,step_trace_time,communication}_viewer.py)."""
    out = d / "node_1_20261130_ascend_ms"
    (out / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    (out / "profiler_info_3.json").write_text("{}")
    cols = ["Step Id", "Model ID", "Task ID", "Stream ID", "Name", "Type", "Accelerator Core",
            "Start Time(us)", "Duration(us)", "Wait Time(us)", "Block Dim"]
    rows = [
        [1, 4, 1, 2, "Default/network-WithLossCell/MatMul-op0", "MatMul", "AI_CORE",
         "1796028000000100.500\t", 40.0, 0.0, 8],
        [1, 4, 2, 7, "hcom_allReduce__101_0_1", "hcom_allReduce_", "HCCL",
         "1796028000000150.000\t", 30.0, 2.5, 0],
        [2, 4, 3, 2, "Gradients/Default/network-WithLossCell/MatMul-op1", "MatMul", "AI_CORE",
         "1796028000001100.250\t", 50.0, 1.0, 8],
    ]
    with (out / "ASCEND_PROFILER_OUTPUT/kernel_details.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        w.writerows(rows)
    (out / "ASCEND_PROFILER_OUTPUT/step_trace_time.csv").write_text(
        "Step,Computing,Communication(Not Overlapped),Overlapped,Communication,Free,Stage,"
        "Bubble,Communication(Not Overlapped and Exclude Receive),Preparing\n"
        "1,40,20,10,30,5,0,0,20,1\n2,50,0,0,0,3,0,0,0,1\n")
    (out / "ASCEND_PROFILER_OUTPUT/communication.json").write_text(json.dumps({"step1": {
        "collective": {"hcom_allReduce__101_0_1@123": {"Communication Time Info": {
            "Start Timestamp(us)": 1796028000000150.0, "Elapse Time(ms)": 0.03,
            "Transit Time(ms)": 0.02, "Wait Time(ms)": 0.005,
            "Synchronization Time(ms)": 0.001}}}, "p2p": {}}}))
    return out


def test_ascend_layout(tmp_path: Path) -> None:
    out = _write_ascend(tmp_path)
    assert msr.looks_like(tmp_path) and msr.looks_like(out / "ASCEND_PROFILER_OUTPUT/"
                                                                "kernel_details.csv")
    [t] = msr.read(tmp_path)
    assert int(t.rank[0]) == 3  # from profiler_info_3.json
    assert t.meta["step_source"] == "Step Id column of the profiler output"
    ops = t.select(_ops(t))
    assert _names(ops).tolist() == ["Default/network-WithLossCell/MatMul-op0",
                                    "hcom_allReduce__101_0_1",
                                    "Gradients/Default/network-WithLossCell/MatMul-op1"]
    assert [EVENT_KINDS[k] for k in ops.kind] == ["compute", "comm", "compute"]
    assert ops.step.tolist() == [1, 1, 2]
    assert ops.start_us.tolist() == [100.5, 150.0, 1100.25]
    assert ops.stream.tolist() == [2, 7, 2]
    assert ops.extra["wait_us"].tolist() == [0.0, 2.5, 1.0]
    assert ops.extra["phase"].tolist() == [0, 3, 1]
    assert t.meta["step_trace"]["comm_exposed_us"] == [20.0, 0.0]
    assert t.meta["step_trace"]["free_us"] == [5.0, 3.0]
    # the collective is already a kernel event: communication.json adds its summary only
    assert t.meta["communication_wait_us"] == pytest.approx(5.0)
    assert t.meta["communication_transit_us"] == pytest.approx(20.0)


@pytest.mark.parametrize("content,expected", [
    (b"", "not valid JSON"),
    (b'[{"ph": "X", "name": "a", "ts": "1', "not valid JSON"),
    (b'{"foo": 1}', "expected a JSON array of Chrome-trace events"),
    (b"[]", "holds no operator events"),
])
def test_broken_trace_view(tmp_path: Path, content: bytes, expected: str) -> None:
    d = tmp_path / "h_1_2_ascend_ms" / "ASCEND_PROFILER_OUTPUT"
    d.mkdir(parents=True)
    (d / "trace_view.json").write_bytes(content)
    with pytest.raises(TraceFormatError, match=expected) as err:
        msr.read(tmp_path)
    assert "h_1_2_ascend_ms" in str(err.value)


def test_not_a_profile(tmp_path: Path) -> None:
    assert not msr.looks_like(tmp_path)
    (tmp_path / "x.json").write_text("[]")
    assert not msr.looks_like(tmp_path / "x.json")
    with pytest.raises(TraceFormatError, match="no MindSpore profiler output found"):
        msr.read(tmp_path)
    with pytest.raises(TraceFormatError, match="does not exist"):
        msr.read(tmp_path / "missing")


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=0, max_value=20000), junk=st.binary(max_size=64))
def test_fuzzed_trace_raises_only_format_errors(shared_data: Path, tmp_path_factory:
                                               pytest.TempPathFactory, cut: int,
                                               junk: bytes) -> None:
    src = _rank_dir(shared_data, "dp2_cpu_msrun") / "ASCEND_PROFILER_OUTPUT/trace_view.json"
    d = tmp_path_factory.mktemp("fuzz") / "h_1_2_ascend_ms" / "ASCEND_PROFILER_OUTPUT"
    d.mkdir(parents=True)
    data = src.read_bytes()
    (d / "trace_view.json").write_bytes(data[:cut] + junk + data[cut + len(junk):])
    try:
        tables = msr.read(d.parent)
    except TraceFormatError:
        return
    assert len(tables) == 1


def test_flat_names_give_no_split() -> None:
    n = 4
    t = EventTable(rank=np.zeros(n, np.int64), kind=np.zeros(n, np.int8),
                   name=np.array([0, 1, 0, 1]), start_us=np.array([0.0, 10.0, 100.0, 110.0]),
                   dur_us=np.full(n, 5.0), stream=np.zeros(n, np.int64),
                   step=np.full(n, -1, np.int64), names=["MatMul", "Add"])
    out = annotate(t)
    assert out.meta["phase_source"].startswith("none: op names carry no scope")
    ops = out.select(_ops(out))
    assert ops.extra["phase"].tolist() == [PHASE_NAMES.index("other")] * 4
    assert ops.step.tolist() == [0, 0, 1, 1]
    assert not out.kind_mask("phase").any()
    assert t.step.tolist() == [-1] * 4  # input untouched


def test_straggler_scores_and_event() -> None:
    assert straggler_scores({0: 0.5, 1: 0.5, 2: 1.0, 3: math.nan}) == {0: 1.0, 1: 1.0, 2: 0.5}
    # the reference is the lower median; two ranks: the faster; below 0.8 is a straggler
    assert straggler_scores({0: 0.5, 1: 0.6, 2: 0.7, 3: 0.8}) == {
        0: pytest.approx(1.2), 1: 1.0, 2: pytest.approx(0.6 / 0.7), 3: pytest.approx(0.75)}
    assert stragglers({0: 1.0, 1: 0.79, 2: 0.8}) == [1]
    ev = cross_rank_event(9, ("step_time_s", "compute_s"), [[1.0, 0.4], [1.0, 0.8]],
                          "compute_s")
    assert ev == {"type": "cross_rank", "step": 9, "ranks": 2,
                  "medians": {"0": {"step_time_s": 1.0, "compute_s": 0.4},
                              "1": {"step_time_s": 1.0, "compute_s": 0.8}},
                  "score_on": "compute_s",
                  "straggler_scores": {"0": 1.0, "1": 0.5},
                  "stragglers": [1], "threshold": 0.8}


def test_loss_watch() -> None:
    as_float = float
    assert find_loss(np.array(2.5, dtype=np.float32), as_float) == (2.5, "ndarray(shape=())")
    assert find_loss((np.ones(()), np.zeros(3, bool)), as_float)[0] == 1.0
    assert find_loss(np.ones((64, 64)), as_float) == (None, "ndarray(shape=(64, 64))")
    assert find_loss(None, as_float) == (None, "None")
    w = LossWatch("the net's outputs")
    assert w.observe(0, 1.0, "x") is None
    f = w.observe(1, None, "were None")
    assert f is not None and f.category == "logging" and f.steps == (1, 1)
    assert f.message == ("no loss recorded: the net's outputs at step 1 were None; "
                         "the loss curve of this run would be empty")
    assert w.observe(2, None, "were None") is None  # reported once
    assert (w.with_loss, w.without_loss) == (1, 2)


def test_two_captures_of_one_rank_are_refused(shared_data: Path) -> None:
    with pytest.raises(TraceFormatError, match="rank 0 appears in two profiler outputs"):
        msr.read(shared_data / MS)  # tinylm run and rank 0 of the msrun job


def _flat_table(ops: list[tuple[str, float, float]]) -> EventTable:
    """A PyNative-like CPU op table (flat names), times in us from origin 0."""
    names = sorted({n for n, _, _ in ops})
    n = len(ops)
    return EventTable(
        rank=np.zeros(n, dtype=np.int64), kind=np.zeros(n, dtype=np.int8),
        name=np.array([names.index(o[0]) for o in ops], dtype=np.int64),
        start_us=np.array([o[1] for o in ops]), dur_us=np.array([o[2] for o in ops]),
        stream=np.zeros(n, dtype=np.int64), step=np.full(n, -1, dtype=np.int64),
        names=names, extra={}, meta={"time_origin_us": 0})


def test_phase_marks_split_flat_pynative_names() -> None:
    ops = [("Default/Conv2D-op0", 10, 30), ("ReLU", 41, 4),  # network forward
           ("ReduceSum", 46, 2), ("Default/OnesLike-op0", 49, 1), ("Neg", 50, 2),  # loss
           ("MatMul", 60, 20), ("Default/Conv2DBackpropFilter-op0", 81, 9),  # backward
           ("Default/SGD-op0", 95, 2), ("Mul", 99, 1)]  # update, then one op after it
    marks = [{"step": 0, "name": "forward", "start_us": 5, "end_us": 45},
             {"step": 0, "name": "loss", "start_us": 45, "end_us": 55},
             {"step": 0, "name": "backward", "start_us": 55, "end_us": 92},
             {"step": 0, "name": "optimizer", "start_us": 93, "end_us": 98}]
    steps = [{"step": 0, "start_us": 0, "end_us": 120}]
    t = annotate(_flat_table(ops), steps, marks)
    o = t.select(_ops(t))
    got = dict(zip(_names(o).tolist(), [PHASE_NAMES[int(p)] for p in o.extra["phase"]],
                   strict=True))
    assert got == {"Default/Conv2D-op0": "forward", "ReLU": "forward",
                   "ReduceSum": "forward", "Default/OnesLike-op0": "backward",
                   "Neg": "backward", "MatMul": "backward",
                   "Default/Conv2DBackpropFilter-op0": "backward",
                   "Default/SGD-op0": "optimizer", "Mul": "other"}
    assert t.meta["phase_source"].startswith("stepscope phase marks")
    assert "8 of 9 marked-step ops fall in a phase window" in t.meta["phase_source"]
    busy = phase_busy_us(t)[0]
    assert (busy["forward"], busy["backward"], busy["optimizer"], busy["other"]) == (
        36.0, 32.0, 2.0, 1.0)


def test_real_pynative_capture_with_marks_reads_back() -> None:
    fixture = Path(__file__).resolve().parents[1] / "data" / "mindspore-pynative-cnn-marks"
    [t] = msr.read(fixture)
    ops = _ops(t)
    names = _names(t)
    phase = t.extra["phase"].astype(int)
    assert t.meta["step_source"] == "stepscope step markers (stepscope_steps.json)"
    assert sorted(set(t.step[ops].tolist())) == [2, 3, 4]
    grad = ops & np.array(["Backprop" in n or "Grad" in n for n in names])
    assert grad.any() and np.all(phase[grad] == PHASE_NAMES.index("backward"))
    seed = ops & (names == "Default/OnesLike-op0")
    assert seed.sum() == 3 and np.all(phase[seed] == PHASE_NAMES.index("backward"))
    conv = ops & (names == "Default/Conv2D-op1")
    assert np.all(phase[conv] == PHASE_NAMES.index("forward"))
    sgd = ops & np.char.startswith(names.astype(str), "Default/SGD")
    assert sgd.any() and np.all(phase[sgd] == PHASE_NAMES.index("optimizer"))
    # by name alone (no marks) the split is a guess: 216 flat ops follow the op before
    # them, and the gradient seed lands in forward
    o = t.select(ops)
    plain = annotate(EventTable(o.rank, o.kind, o.name, o.start_us, o.dur_us, o.stream,
                                o.step, o.names, {}, dict(o.meta)))
    assert plain.meta["phase_source"] == ("inferred from op names (graph-mode scopes); 216 "
                                          "unscoped ops took the phase of the op before them")
    pnames, pphase = _names(plain), plain.extra["phase"].astype(int)
    assert np.all(pphase[pnames == "Default/OnesLike-op0"] == PHASE_NAMES.index("forward"))


def test_one_rank_read_alone_keeps_its_rank(shared_data: Path) -> None:
    from stepscope.analysis.trace.breakdown import analyze

    rank1 = sorted((shared_data / MS / "dp2_cpu_msrun").glob("*_ascend_ms"))[1]
    [t] = msr.read(rank1)
    assert t.meta["rank"] == 1 and int(t.rank[0]) == 1
    assert list(analyze([t]).ranks) == [1]
