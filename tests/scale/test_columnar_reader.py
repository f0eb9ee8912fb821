"""The columnar step reader equals the old one on runs the Recorder writes, and validates.

The oracle is the reader as it was before (tests/support/old_step_reader.py). The runs are
written by the project's own Recorder (several ranks, NaN/inf losses, late records, user
metrics, phases) plus the torn and corrupt lines the old tests used.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from stepscope import Recorder, RunDir, RunMeta
from stepscope.rundir import steps_decode as decode
from stepscope.schema import StepTable
from support.old_step_reader import assert_tables_equal, old_read_steps


class _Clock:
    """Injected time: each call advances by the next of a fixed cycle of increments."""

    def __init__(self, rank: int) -> None:
        self.t = 0.0
        self.i = rank

    def __call__(self) -> float:
        self.i += 1
        self.t += 0.001 * (1 + self.i % 7)
        return self.t


def _record_run(path: Path, ranks: int = 3, steps: int = 400) -> None:
    for rank in range(ranks):
        rec = Recorder(path, rank=rank, background=False, clock=_Clock(rank),
                       wall_clock=_Clock(rank), no_usage=True)
        for i in range(steps):
            with rec.step(tokens=128 * (rank + 1), samples=4) as s:
                with s.phase("forward"):
                    pass
                with s.phase("backward"):
                    pass
                loss = float("nan") if i == 50 else (math.inf if i == 51 else 3.0 - i / steps)
                s.log(loss=loss, lr=1e-3)
                if i % 10 == 0:
                    s.log(my_metric=float(i))
            if i % 25 == 0:
                rec.log(grad_norm=float("nan") if i == 100 else 0.5)  # late record
        rec.close()


def test_equals_the_old_reader_on_recorder_runs(tmp_path: Path) -> None:
    _record_run(tmp_path / "run")
    with open(tmp_path / "run" / "steps" / "rank-00001.jsonl", "ab") as f:
        f.write(b'{"rank":1,"step":400,"step_ti')  # the writer died mid-line
    old, old_stats = old_read_steps(tmp_path / "run")
    new, stats = RunDir.open(tmp_path / "run").read_steps(cache=False)
    assert "loss_nan" in new and "grad_norm_nan" in new and "my_metric" in new
    assert_tables_equal(new, old)
    assert (stats.records, stats.skipped, stats.torn_tail, stats.files) == (
        old_stats.records, old_stats.skipped, old_stats.torn_tail, old_stats.files)
    assert stats.reasons == {"torn last line": 1}


def test_chunks_with_bad_lines_give_the_same_table_as_one_chunk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A corrupt line sends only its chunk down the line-by-line path."""
    _record_run(tmp_path / "run", ranks=1, steps=300)
    f = tmp_path / "run" / "steps" / "rank-00000.jsonl"
    lines = f.read_bytes().split(b"\n")
    lines.insert(120, b"not json")
    f.write_bytes(b"\n".join(lines))
    old, old_stats = old_read_steps(tmp_path / "run")
    monkeypatch.setattr(decode, "CHUNK_BYTES", 2048)
    new, stats = RunDir.open(tmp_path / "run").read_steps(cache=False)
    assert_tables_equal(new, old)
    assert stats.skipped == old_stats.skipped == 1
    assert stats.problems == ["rank-00000.jsonl:121: corrupt record, skipped"]


def _read(tmp_path: Path, body: bytes) -> tuple[StepTable, decode.ReadStats]:
    run = RunDir.create(tmp_path / "run", RunMeta(run_id="v"))
    run.steps_path(0).write_bytes(body)
    return run.read_steps(cache=False)


def test_bool_step_and_out_of_range_ids_are_skipped_per_reason(tmp_path: Path) -> None:
    huge = b"1" + b"0" * 400
    table, stats = _read(tmp_path, b'{"step":true,"step_time_s":1}\n'
                                   b'{"step":-1,"step_time_s":1}\n'
                                   b'{"step":1,"rank":false}\n'
                                   b'{"step":' + huge + b'}\n'
                                   b'{"step":2,"step_time_s":1}\n')
    assert table["step"].tolist() == [2]
    assert stats.skipped == 4
    # orjson (the line path) refuses a 400-digit integer as JSON: corrupt, not a crash.
    assert stats.reasons == {"no integer step/rank": 2, "step/rank out of range": 1,
                             "corrupt JSON": 1}


def test_bad_values_are_dropped_and_counted_not_poisoning_the_column(tmp_path: Path) -> None:
    table, stats = _read(tmp_path, b'{"step":0,"step_time_s":1,"tokens":"Infinity"}\n'
                                   b'{"step":1,"step_time_s":"NaN","tokens":100}\n'
                                   b'{"step":2,"step_time_s":-0.1,"tokens":1e300}\n'
                                   b'{"step":3,"step_time_s":1,"tokens":100,"loss":"NaN"}\n')
    assert np.isnan(table["tokens"][[0, 2]]).all() and table["tokens"][[1, 3]].tolist() == [
        100.0, 100.0]
    assert np.isnan(table["step_time_s"][[1, 2]]).all()
    assert "step_time_s_nan" not in table  # a NaN step time is "not known", not a value
    assert table["loss_nan"].tolist() == [0.0, 0.0, 0.0, 1.0]  # a NaN loss is a value
    assert stats.skipped == 0 and stats.rejected == 4
    assert stats.reasons == {"tokens: not finite": 1, "step_time_s: not finite": 1,
                             "step_time_s: negative": 1, "tokens: implausible (> 1e+12)": 1}


def test_fast_and_line_paths_apply_the_same_rules(tmp_path: Path) -> None:
    """The same bad numbers, once in a chunk msgspec decodes and once beside a bad line."""
    good = b'{"step":0,"step_time_s":-1,"tokens":1e300}\n{"step":1,"step_time_s":2}\n'
    t1, s1 = _read(tmp_path / "a", good)
    t2, s2 = _read(tmp_path / "b", good + b'{"step":2,"lr":"x"}\n')
    assert s1.reasons == {"step_time_s: negative": 1, "tokens: implausible (> 1e+12)": 1}
    assert s2.reasons == {**s1.reasons, "lr: not a number": 1}
    assert np.array_equal(t1["step_time_s"], t2["step_time_s"][:2], equal_nan=True)


def test_duplicate_rank_step_keeps_the_first_and_is_counted(tmp_path: Path) -> None:
    table, stats = _read(tmp_path, b'{"step":0,"step_time_s":1.0,"tokens":10000}\n'
                                   b'{"step":1,"step_time_s":1.0,"tokens":10000}\n'
                                   b'{"step":1,"step_time_s":21.2,"tokens":10000}\n'
                                   b'{"step":1,"loss":2.5}\n')  # late: fills a gap, merged
    assert table["step"].tolist() == [0, 1]
    assert table["step_time_s"].tolist() == [1.0, 1.0]
    assert table["loss"][1] == 2.5
    assert stats.duplicates == 1 and stats.skipped == 1 and stats.records == 2
    assert stats.reasons == {"duplicate (rank, step)": 1}
    assert "rank 0 step 1 recorded twice" in stats.problems[0]


def test_a_late_record_replaces_a_value_as_the_trainer_callback_needs(tmp_path: Path) -> None:
    """integrations/hf.py logs the Trainer's grad norm after the step, over its own."""
    table, stats = _read(tmp_path, b'{"step":0,"end_s":1,"step_time_s":1,"grad_norm":0.5}\n'
                                   b'{"step":0,"grad_norm":0.7}\n')
    assert table["grad_norm"].tolist() == [0.7] and stats.skipped == 0


def test_the_same_rank_in_two_files_is_a_duplicate(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "run", RunMeta(run_id="d"))
    run.steps_path(0).write_bytes(b'{"rank":0,"step":0,"step_time_s":1}\n')
    run.steps_path(1).write_bytes(b'{"rank":0,"step":0,"loss":1}\n'
                                  b'{"rank":1,"step":0,"step_time_s":2}\n')
    table, stats = run.read_steps(cache=False)
    assert table["rank"].tolist() == [0, 1] and math.isnan(table["loss"][0])
    assert stats.reasons == {"duplicate (rank, step) in another rank file": 1}
    assert stats.records == 2


@pytest.mark.parametrize(("field", "value"), [
    ("environment", [1]), ("baseline", "str"), ("config", 3), ("status", None),
    ("command", [1, 2]), ("schema_version", True)])
def test_run_json_field_of_the_wrong_type_is_dropped_with_a_warning(
        tmp_path: Path, field: str, value: object) -> None:
    import orjson

    run = RunDir.create(tmp_path / "run", RunMeta(run_id="m", baseline={"seq_len": 8}))
    raw = orjson.loads(run.meta_path.read_bytes())
    raw[field] = value
    run.meta_path.write_bytes(orjson.dumps(raw))
    with pytest.warns(RuntimeWarning, match=f"'{field}' is"):
        meta = RunDir.open(run.path).read_meta()
    default = RunMeta(run_id="m")
    assert getattr(meta, field) == getattr(default, field) or field == "baseline"
    assert meta.run_id == "m"


def test_run_json_numeric_variables_of_the_wrong_type_are_dropped(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "run", RunMeta(
        run_id="m", baseline={"num_devices": "abc", "seq_len": "8", "model_name": "x"},
        environment={"peak_flops_per_device": [1], "framework": "torch"}))
    with pytest.warns(RuntimeWarning):
        meta = run.read_meta()
    assert meta.baseline == {"seq_len": "8", "model_name": "x"}
    assert meta.environment == {"framework": "torch"}
    assert len(run.meta_problems) == 2


@pytest.mark.parametrize("fixture", ["run-torn-last-line", "run-ddp-two-ranks"])
def test_equals_the_old_reader_on_the_fixture_runs(tmp_path: Path, fixture: str) -> None:
    """Run directories `stepscope run` wrote (tests/data/<fixture>/NOTE.md), cached and not."""
    import shutil

    run = tmp_path / fixture
    shutil.copytree(Path(__file__).parents[1] / "data" / fixture, run)
    old, old_stats = old_read_steps(run)
    for cache in (False, True, True):  # cold, then writing the cache, then from it
        new, stats = RunDir.open(run).read_steps(cache=cache)
        assert_tables_equal(new, old)
        assert (stats.records, stats.skipped, stats.torn_tail, stats.files) == (
            old_stats.records, old_stats.skipped, old_stats.torn_tail, old_stats.files)
    assert (run / ".cache" / "steps").is_dir()


@pytest.mark.parametrize("seed", range(40))
def test_the_one_pass_screen_never_hides_a_value_to_drop(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``_validate`` checks only the columns a min/max screen names: on blocks with
    negative, infinite, implausible and explicit-NaN values here and there, it drops and
    counts exactly what checking every column drops."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    cols: dict[str, np.ndarray] = {"step": np.arange(n, dtype=float), "rank": np.zeros(n)}
    flags: dict[str, np.ndarray] = {}
    for name, rule in decode.VALUE_RULES.items():
        if rng.random() < 0.3:
            continue
        col = rng.uniform(0, rule.limit or 1e6, n)
        for bad in (-1.0, math.inf, -math.inf, math.nan, 2 * (rule.limit or 1e300), -0.0,
                    float(rule.limit or 1.0)):
            if rng.random() < 0.15:
                col[rng.integers(0, n)] = bad
        cols[name] = col
        if rng.random() < 0.2:
            flag = np.zeros(n, bool)
            flag[rng.integers(0, n)] = True
            col[flag] = math.nan
            flags[name] = flag
    screened = decode.Block(n, {k: v.copy() for k, v in cols.items()},
                            {k: v.copy() for k, v in flags.items()})
    s1 = decode.ReadStats()
    decode._validate(screened, s1)
    every = decode.Block(n, {k: v.copy() for k, v in cols.items()},
                         {k: v.copy() for k, v in flags.items()})
    monkeypatch.setattr(decode, "_suspects", lambda b: [c for c in decode.VALUE_RULES
                                                        if c in b.cols])
    s2 = decode.ReadStats()
    decode._validate(every, s2)
    assert s1.to_dict() == s2.to_dict()
    assert screened.cols.keys() == every.cols.keys()
    for k in every.cols:
        assert np.array_equal(screened.cols[k], every.cols[k], equal_nan=True), k
    assert {k: v.tolist() for k, v in screened.flags.items()} == {
        k: v.tolist() for k, v in every.flags.items()}
