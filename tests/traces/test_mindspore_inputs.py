"""MindSpore users' other inputs: msprof PROF_* directories (current and older CANN
layouts) and MindSpore's older flat profiler/ folder. See each tests/data/*/NOTE.md for
which files are real and which were generated."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from stepscope.analysis.trace.breakdown import analyze
from stepscope.errors import TraceFormatError
from stepscope.schema import EVENT_KINDS, EventTable
from stepscope.traces import detect_format, read_trace
from stepscope.traces import mindspore as msr
from stepscope.traces.mindspore_phases import PHASE_NAMES

DATA = Path(__file__).resolve().parents[1] / "data"
MSPROF = DATA / "msprof-generated"
NEW = MSPROF / "PROF_000001_20261201120000123_KQJMLBCA"
OLD = MSPROF / "PROF_000002_20261201120500456_PLMQRSTU"
V1 = DATA / "mindspore-profiler-v1-generated" / "profiler"
V1_CPU = DATA / "mindspore-profiler-v1-cpu" / "profiler"
OPS = [EVENT_KINDS.index("compute"), EVENT_KINDS.index("comm")]


def _ops(t: EventTable) -> EventTable:
    return t.select(np.isin(t.kind, OPS))


def _names(t: EventTable) -> list[str]:
    return [t.names[i] for i in t.name]


def test_msprof_op_summary_is_read_with_types_waits_and_phases() -> None:
    [t] = msr.read(NEW)
    assert t.meta["format"] == "msprof" and t.meta["rank"] == 3
    assert t.meta["rank_source"].startswith("the msprof device id")
    o = _ops(t)
    assert len(o) == 10 and o.meta["source"].endswith("op_summary_20261201120001.csv")
    # "1796100000000000.000\t": the tab msprof writes is dropped, the time kept exactly
    assert float(o.start_us.min()) + t.meta["time_origin_us"] == 1796100000000000.0
    comm = o.kind == EVENT_KINDS.index("comm")
    assert [n for n, c in zip(_names(o), comm, strict=True) if c] == [
        "hcom_allReduce__123_1_1"] * 2
    assert np.nansum(o.extra["wait_us"]) == 8.0  # 4 tasks x 1 us per step, 2 steps
    types = dict(zip(t.names, t.meta["op_types"], strict=False))
    assert types["hcom_allReduce__123_1_1"] == "hcom_allReduce_"
    phases = {n: PHASE_NAMES[int(p)] for n, p in zip(_names(o), o.extra["phase"], strict=True)}
    assert sorted(set(phases.values())) == ["backward", "comm", "forward", "optimizer"]
    assert np.bincount(o.step).tolist() == [5, 5]


def test_msprof_timeline_alone_gives_the_same_tasks(tmp_path: Path) -> None:
    d = tmp_path / NEW.name / "mindstudio_profiler_output"
    d.mkdir(parents=True)
    shutil.copy(NEW / "mindstudio_profiler_output" / "msprof_20261201120001.json", d)
    [a], [b] = msr.read(NEW), msr.read(d.parent)
    assert b.meta["source"].endswith("msprof_20261201120001.json")
    oa, ob = _ops(a), _ops(b)  # the CANN host rows are skipped, the device tasks kept
    assert sorted(zip(_names(oa), oa.start_us.tolist(), oa.dur_us.tolist(), strict=True)) == \
        sorted(zip(_names(ob), ob.start_us.tolist(), ob.dur_us.tolist(), strict=True))
    assert b.meta["rows_skipped"] == 10


def test_older_cann_layout_and_a_folder_of_prof_dirs() -> None:
    [t] = msr.read(OLD)
    assert t.meta["rank"] == 0 and len(_ops(t)) == 10
    assert detect_format(MSPROF) == "mindspore"
    assert sorted(analyze(read_trace(MSPROF)).ranks) == [0, 3]


def test_mindspore_v1_timeline_txt_reads_units_from_its_header() -> None:
    [v1], [new] = msr.read(V1), msr.read(NEW)
    assert v1.meta["format"].startswith("mindspore profiler/") and v1.meta["rank"] == 1
    a, b = _ops(v1), _ops(new)
    # duration(ms) in the file: the same microseconds as op_summary's Task Duration(us)
    assert np.allclose(np.sort(a.dur_us), np.sort(b.dur_us), atol=1e-6)
    assert np.allclose(np.sort(a.start_us) + v1.meta["time_origin_us"],
                       np.sort(b.start_us) + new.meta["time_origin_us"], atol=1e-3)


def test_mindspore_v1_cpu_file_reads_like_the_current_framework_folder() -> None:
    [old] = msr.read(V1_CPU)
    [cur] = msr.read(next((DATA / "mindspore-pynative-cnn-marks").glob("*_ascend_ms")))
    a, b = _ops(old), _ops(cur)
    assert len(a) == len(b) and old.meta["rank"] == 0
    assert np.isclose(a.dur_us.sum(), b.dur_us.sum(), rtol=0, atol=1e-3)


def test_a_prof_dir_without_exported_files_says_what_to_do(tmp_path: Path) -> None:
    d = tmp_path / "PROF_000003_20261201121000789_ABCDEFGH"
    (d / "device_0").mkdir(parents=True)
    with pytest.raises(TraceFormatError, match=r"msprof --export=on"):
        msr.read(d)
