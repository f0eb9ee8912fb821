"""`stepscope trace` and `stepscope trace diff`: JSON shape, terminal output, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from stepscope.cli import _register, cli
from support.traces import cpu_step_events, thread_name, write_trace


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from stepscope.cli import main; main()",
                           *args], capture_output=True, text=True, timeout=120)


def _invoke(*args: str) -> tuple[int, str]:
    _register()
    res = CliRunner().invoke(cli, list(args))
    return res.exit_code, res.output


def _trace(tmp_path: Path, steps: int = 2) -> Path:
    events = [thread_name(2, "pt_gloo_runloop")]
    for k in range(steps):
        events += cpu_step_events(offset=100.0 * k, step=k + 1)
    return write_trace(tmp_path / "rank0.pt.trace.json", events)


def test_json_shape(tmp_path: Path) -> None:
    code, out = _invoke("trace", str(_trace(tmp_path)), "--json", "--steps", "2:2")
    assert code == 0, out
    doc = json.loads(out)
    assert set(doc) == {"ranks", "top_ops", "comparison", "hta_compatible", "conventions",
                        "warnings"}
    rank = doc["ranks"]["0"]
    assert {"idle_pct", "compute_pct", "non_compute_pct", "comm_comp_overlap_pct",
            "steps"} <= set(rank)
    assert [s["step"] for s in rank["steps"]] == [2]
    assert rank["steps"][0]["backward_us"] == 40.0
    assert doc["top_ops"][0]["name"] == "aten::mm_backward"


def test_terminal_output_has_bars_and_ops(tmp_path: Path) -> None:
    code, out = _invoke("trace", str(_trace(tmp_path)))
    assert code == 0, out
    assert "█" in out and "Top 10 ops" in out and "aten::mm" in out
    assert "convention: exact float timestamps" in out


def test_diff_json(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = _trace(tmp_path / "a")
    b = _trace(tmp_path / "b", steps=3)
    code, out = _invoke("trace", "diff", str(a), str(b), "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert (doc["a_steps"], doc["b_steps"]) == (2, 3)
    assert {o["status"] for o in doc["ops"]} == {"same"}  # per step, nothing changed


@pytest.mark.xdist_group("trace_gpu")
def test_hta_compatible_json_on_real_trace(shared_data: Path) -> None:
    ref = json.loads((shared_data / "traces/kineto-gpu/hta_reference.json").read_text())
    path = shared_data / "traces/kineto-gpu/nccl_parser_config/nccl_data.json.gz"
    code, out = _invoke("trace", str(path), "--hta-compatible", "--json")
    assert code == 0, out
    got = json.loads(out)["ranks"]["0"]
    want = ref["traces"]["nccl_parser_config"]["default"]["0"]
    for k in ("idle_pct", "compute_pct", "non_compute_pct", "comm_comp_overlap_pct"):
        assert abs(got[k] - want[k]) <= 0.1, k


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X"')
    res = _run("trace", str(bad))
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("stepscope: error: ")
    assert str(bad) in res.stderr
    res = _run("trace", str(_trace(tmp_path)), "--steps", "a:b")
    assert res.returncode == 2 and "expected 'a:b'" in res.stderr


def test_run_directory_means_its_latest_profile(tmp_path: Path) -> None:
    from stepscope.rundir.store import RunDir
    from stepscope.schema import RunMeta
    run = RunDir.create(tmp_path / "run", RunMeta(run_id="r1"))
    prof = run.new_profile_dir()
    _trace(prof)
    code, out = _invoke("trace", str(run.path), "--json")
    assert code == 0, out
    assert json.loads(out)["ranks"]["0"]["source"].startswith(str(prof))
    empty = RunDir.create(tmp_path / "run2", RunMeta(run_id="r2"))
    code, out = _invoke("trace", str(empty.path))
    assert code != 0


def test_mindspore_directory_dispatches_to_its_reader(shared_data: Path) -> None:
    code, out = _invoke("trace", str(shared_data / "traces/mindspore-cpu/dp2_cpu_msrun"),
                        "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert sorted(doc["ranks"]) == ["0", "1"]
    for rank in doc["ranks"].values():
        assert rank["comm_us"] > 0 and rank["steps"]
        for row in rank["steps"]:
            parts = sum(row[f"{p}_us"] for p in ("data", "forward", "backward",
                                                  "comm_exposed", "optimizer", "other", "idle"))
            assert parts == pytest.approx(row["step_time_us"])
    assert any("step source: inferred" in w for w in doc["warnings"])
