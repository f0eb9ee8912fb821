"""`stepscope export` into the real libraries (tensorboardX writes, TensorBoard's own
EventAccumulator reads; MLflow with a SQLite tracking URI; CSV; Parquet through pyarrow).
Every number is checked against a plain JSON parse of the fixture's step files."""

from __future__ import annotations

import csv
import json
import math
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "data"
RUN = DATA / "run-ddp-two-ranks"


def _rows() -> list[dict[str, float]]:
    return [json.loads(line) for f in sorted((RUN / "steps").glob("*.jsonl"))
            for line in f.read_text().splitlines()]


def _expected() -> dict[str, dict[int, float]]:
    """The series by hand: loss from rank 0, the job's step time = max over ranks."""
    by_step: dict[int, list[dict[str, float]]] = defaultdict(list)
    for r in _rows():
        by_step[int(r["step"])].append(r)
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for step, rows in by_step.items():
        r0 = min(rows, key=lambda r: r["rank"])
        out["result/loss"][step] = r0["loss"]
        out["result/perplexity"][step] = math.exp(r0["loss"])
        t = max(r["step_time_s"] for r in rows)
        out["efficiency/step_time_s"][step] = t
        out["efficiency/tokens_per_s"][step] = sum(r["tokens"] for r in rows) / t
        for r in rows:
            out[f"ranks/{int(r['rank']):05d}/step_time_s"][step] = r["step_time_s"]
    return out


def _copy(tmp_path: Path) -> Path:
    """The fixture, copied: the reader writes its column cache beside the step files."""
    copy = tmp_path / RUN.name
    if not copy.exists():
        shutil.copytree(RUN, copy)
    return copy


def _export(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    copy = _copy(tmp_path)
    return subprocess.run([sys.executable, "-m", "stepscope", "export", str(copy), *args],
                          capture_output=True, text=True, timeout=120, check=False)


def test_tensorboard_event_files_hold_the_same_series_as_the_records(tmp_path: Path) -> None:
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    pytest.importorskip("tensorboardX")
    proc = _export(tmp_path, "--to", "tensorboard", str(tmp_path / "tb"))
    assert proc.returncode == 0, proc.stderr
    ea = ea_mod.EventAccumulator(str(tmp_path / "tb"))
    ea.Reload()
    walls = {int(r["step"]): r["wall_time_s"] for r in _rows() if r["rank"] == 1}
    for tag, want in _expected().items():
        got = {e.step: e.value for e in ea.Scalars(tag)}
        assert got.keys() == want.keys(), tag
        for step, v in want.items():
            assert got[step] == pytest.approx(v, rel=1e-6), (tag, step)  # float32 in events
    # A point's wall time is its step's end (the slowest rank's), not the export's clock.
    ends = {e.step: e.wall_time for e in ea.Scalars("efficiency/step_time_s")}
    for step, wall in ends.items():
        mx = max(r["wall_time_s"] for r in _rows() if r["step"] == step)
        assert wall == pytest.approx(mx, abs=1e-3) and mx >= walls[step]
    assert "summary/tokens_per_s" in ea.Tags()["scalars"]
    assert {"run", "findings"} <= {t.split("/")[0] for t in ea.Tags()["tensors"]}


def test_mlflow_run_holds_params_metrics_and_status(tmp_path: Path) -> None:
    mlflow = pytest.importorskip("mlflow")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = _export(tmp_path, "--to", "mlflow", uri, "--experiment", "exp-a", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    client = mlflow.MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("exp-a").experiment_id])
    assert run.info.run_id in out["destination"]
    assert run.info.status == "FINISHED"
    meta = json.loads((RUN / "run.json").read_text())
    assert run.data.tags["stepscope.run_id"] == meta["run_id"]
    assert run.data.params["baseline.dp"] == str(meta["baseline"]["dp"])
    assert "straggler" in run.data.tags["stepscope.findings"]  # diagnose's rank-0 finding
    for tag, want in _expected().items():
        hist = {m.step: m.value for m in client.get_metric_history(run.info.run_id, tag)}
        assert hist == pytest.approx(want, rel=1e-12), tag


def test_csv_and_parquet_carry_the_whole_step_table(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    assert _export(tmp_path, "--to", "csv", str(tmp_path / "s.csv")).returncode == 0
    assert _export(tmp_path, "--to", "parquet", str(tmp_path / "s.parquet")).returncode == 0
    rows = sorted(_rows(), key=lambda r: (r["rank"], r["step"]))
    with open(tmp_path / "s.csv", newline="") as fh:
        got = list(csv.DictReader(fh))
    table = pq.read_table(tmp_path / "s.parquet")
    cols = table.to_pydict()
    assert len(got) == len(rows) == table.num_rows
    for i, row in enumerate(rows):
        for key in ("rank", "step", "step_time_s", "loss", "comm_s", "tokens"):
            assert float(got[i][key]) == float(row[key])
            assert float(cols[key][i]) == float(row[key])
    meta = json.loads(table.schema.metadata[b"stepscope.run"])
    assert meta["run_id"] == json.loads((RUN / "run.json").read_text())["run_id"]


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "stepscope", "export", str(tmp_path / "nope"),
                           "--to", "csv", str(tmp_path / "x.csv")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    proc = _export(tmp_path, "--to", "excel", str(tmp_path / "x"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert not (tmp_path / "x").exists()


def test_a_missing_library_is_named_before_anything_is_written(tmp_path: Path) -> None:
    # The package is installed here; hiding it from the import system is the only way to
    # meet the "not installed" case on this machine.
    code = ("import sys; sys.modules['mlflow'] = None; from stepscope.cli import main; "
            f"main(['export', {str(_copy(tmp_path))!r}, '--to', 'mlflow', 'sqlite:///{tmp_path}/m.db'])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2
    assert "needs the mlflow package" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "m.db").exists()
