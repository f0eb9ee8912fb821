"""`stepscope run` on unmodified single-process PyTorch scripts (real torch on CPU).

Each test launches a fixture script from tests/scripts/ under `stepscope run` and checks
the run directory against what the script itself printed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from stepscope.rundir.store import RunDir
from support.torch_run import assert_times_agree, printed_times, python_script, stepscope_run

pytestmark = pytest.mark.xdist_group("torch_run")


def test_plain_loop_step_table_matches_script_timestamps(tmp_path):
    out = tmp_path / "plain"
    proc = stepscope_run(out, *python_script("torch_plain.py", "--steps", "12"))
    assert proc.returncode == 0, proc.stderr
    table, stats = RunDir(out).read_steps()
    assert stats.skipped == 0
    assert table["step"].tolist() == list(range(12))
    assert table["rank"].tolist() == [0] * 12
    assert_times_agree(table["step_time_s"], table["step"], printed_times(proc.stdout))
    for col in ("data_wait_s", "forward_s", "backward_s", "optimizer_s", "loss", "lr",
                "grad_norm", "mem_peak_bytes"):
        assert np.isfinite(table[col]).all(), col
    # the model sees batch[:, :-1]: 16 samples x 128 tokens per step
    assert table["tokens"].tolist() == [16 * 128.0] * 12
    assert table["samples"].tolist() == [16.0] * 12
    assert table["lr"].tolist() == [1e-3] * 12
    losses = [float(line.split("loss=")[1]) for line in proc.stdout.splitlines()]
    assert np.allclose(table["loss"], losses, atol=1e-6)
    phases = table["data_wait_s"] + table["forward_s"] + table["backward_s"] \
        + table["optimizer_s"]
    assert (phases <= table["step_time_s"] * 1.0001).all()


def test_plain_loop_run_json_fingerprint(tmp_path):
    out = tmp_path / "plain"
    proc = stepscope_run(out, *python_script("torch_plain.py", "--steps", "3"),
                         args=("--name", "fp"))
    assert proc.returncode == 0, proc.stderr
    meta = RunDir(out).read_meta()
    assert meta.status == "finished" and meta.error is None
    b = meta.baseline
    # Embedding 128x256 + Linear 256->1024 + Linear 1024->256 + Linear 256->128
    assert b["num_params"] == 128 * 256 + (256 * 1024 + 1024) + (1024 * 256 + 256) \
        + (256 * 128 + 128)
    assert len(b["model_structure_hash"]) == 16
    assert b["num_devices"] == 1 and b["device_kind"] == "cpu"
    assert b["micro_batch"] == 16 and b["seq_len"] == 128 and b["grad_accum"] == 1
    assert b["batch_shape"] == [[16, 129]]
    assert b["optimizer"] == "AdamW" and b["lr"] == 1e-3 and b["weight_decay"] == 0.1
    assert b["optimizer_hparams"]["betas"] == [0.9, 0.999]
    assert b["precision"] == "fp32" and b["seed"] == 1234
    env = meta.environment
    assert env["framework"] == "torch" and env["framework_version"].startswith("2.")
    # 6 x matmul parameters: the untied 128 x 256 embedding is a lookup, no matmul
    assert b["embedding_lookup_params"] == 128 * 256
    assert env["flops_per_token"] == 6 * (b["num_params"] - 128 * 256)
    assert "embedding-lookup" in env["flops_convention"]
    assert b["batch_layout"] == "[batch, seq]"
    assert meta.config["missing"] == []
    assert meta.name == "fp" and meta.command[1].endswith("torch_plain.py")


def test_grad_accumulation_four_micro_batches_per_step(tmp_path):
    out = tmp_path / "accum"
    proc = stepscope_run(out, *python_script("torch_accum.py", "--steps", "5"))
    assert proc.returncode == 0, proc.stderr
    table, _ = RunDir(out).read_steps()
    assert len(table) == 5
    assert table["tokens"].tolist() == [4 * 4 * 32.0] * 5  # 4 micro-batches of 4 x 32
    assert table["samples"].tolist() == [16.0] * 5
    assert table["micro_batches"].tolist() == [4.0] * 5
    assert not table.has_data("data_wait_s")  # no DataLoader: unknown, not zero
    meta = RunDir(out).read_meta()
    assert meta.baseline["grad_accum"] == 4 and meta.baseline["seed"] == 7
    assert meta.baseline["optimizer_hparams"]["momentum"] == 0.9
    events, _ = RunDir(out).read_events(type="finding")
    assert [e["message"].split(":")[0] for e in events] == ["no data wait recorded"]


def test_slow_collate_shows_as_data_wait_and_replay_removes_it(tmp_path):
    slow = tmp_path / "slow"
    proc = stepscope_run(slow, *python_script("torch_slow_collate.py", "--steps", "6"))
    assert proc.returncode == 0, proc.stderr
    table, _ = RunDir(slow).read_steps()
    assert len(table) == 6
    assert (table["data_wait_s"] >= 0.050).all()
    # median per-step share: robust to a step slowed by other load on this shared machine
    share = np.median(table["data_wait_s"] / table["step_time_s"])
    assert share > 0.5, {c: table[c].tolist() for c in ("step_time_s", "data_wait_s",
                                                         "forward_s", "backward_s")}
    phases = table["data_wait_s"] + table["forward_s"] + table["backward_s"] \
        + table["optimizer_s"]
    assert (phases <= table["step_time_s"] * 1.0001).all()
    assert_times_agree(table["step_time_s"], table["step"], printed_times(proc.stdout))

    replay = tmp_path / "replay"
    proc = stepscope_run(replay, *python_script("torch_slow_collate.py", "--steps", "6"),
                         env={"STEPSCOPE_REPLAY_DATA": "1", "STEPSCOPE_REPLAY_BATCHES": "2"})
    assert proc.returncode == 0, proc.stderr
    t2, _ = RunDir(replay).read_steps()
    assert len(t2) == 6  # the epoch still ends after len(loader) batches
    assert (t2["data_wait_s"][:2] >= 0.050).all()  # the two real batches
    assert (t2["data_wait_s"][2:] < 0.010).all()  # replayed from memory
    assert t2["tokens"].tolist() == table["tokens"].tolist()  # identical shapes
    assert "modified_by_data" in RunDir(replay).read_meta().config


def test_crash_keeps_records_and_marks_run_failed(tmp_path):
    out = tmp_path / "crash"
    proc = stepscope_run(out, *python_script("torch_crash.py"))
    assert proc.returncode == 1
    assert "ValueError: corrupt shard 17" in proc.stderr  # the script's traceback is intact
    table, _ = RunDir(out).read_steps()
    assert table["step"].tolist() == [0, 1, 2, 3, 4]
    meta = RunDir(out).read_meta()
    assert meta.status == "failed"
    assert meta.error == "ValueError: corrupt shard 17"


def test_max_steps_stops_cleanly(tmp_path):
    out = tmp_path / "max"
    proc = stepscope_run(out, *python_script("torch_plain.py", "--steps", "12"),
                         args=("--max-steps", "4"))
    assert proc.returncode == 0, proc.stderr
    table, _ = RunDir(out).read_steps()
    assert table["step"].tolist() == [0, 1, 2, 3]
    meta = RunDir(out).read_meta()
    assert meta.status == "finished"
    assert meta.config["stopped_by"] == "STEPSCOPE_MAX_STEPS=4"
    # SystemExit leaves optimizer.step() of step 3, before the script's own print
    assert "STEP 2 " in proc.stdout and "STEP 3 " not in proc.stdout


def test_profile_steps_archives_a_trace(tmp_path):
    out = tmp_path / "prof"
    proc = stepscope_run(out, *python_script("torch_plain.py", "--steps", "6"),
                         args=("--profile-steps", "2:3", "--json"))  # 2 and 3, both ends
    assert proc.returncode == 0, proc.stderr
    dirs = RunDir(out).profile_dirs()
    assert len(dirs) == 1
    trace = dirs[0] / "rank-00000.pt.trace.json"
    assert trace.is_file()
    text = trace.read_text()
    assert "ProfilerStep#2" in text and "ProfilerStep#3" in text
    assert "ProfilerStep#4" not in text and "ProfilerStep#1" not in text
    table, _ = RunDir(out).read_steps()
    assert len(table) == 6
    outcome = json.loads(proc.stdout.strip().splitlines()[-1])
    assert outcome["profile_analysis"]["status"] == "analyzed", outcome["profile_analysis"]
    report = outcome["profile_analysis"]["report"]
    assert report == json.loads(Path(outcome["profile_analysis"]["analysis_file"]).read_text(
    ))["report"]
    events, _ = RunDir(out).read_events(type="profile")
    assert events[0]["status"] == "analyzed" and events[0]["steps"] == "2:3"


def test_bad_profile_steps_is_a_one_line_error(tmp_path):
    proc = stepscope_run(tmp_path / "bad", *python_script("torch_plain.py"),
                         args=("--profile-steps", "5:2"))
    assert proc.returncode == 2
    assert proc.stderr.startswith("stepscope: error: --profile-steps")
    assert "Traceback" not in proc.stderr


def test_script_without_optimizer_says_what_is_missing(tmp_path):
    script = tmp_path / "no_opt.py"
    script.write_text("import torch\nm = torch.nn.Linear(2, 2)\n"
                      "for _ in range(3):\n    m(torch.ones(1, 2)).sum().backward()\n")
    out = tmp_path / "noopt"
    import sys
    proc = stepscope_run(out, sys.executable, str(script))
    assert proc.returncode == 0, proc.stderr
    meta = RunDir(out).read_meta()
    assert meta.status == "finished"
    table, _ = RunDir(out).read_steps()
    assert len(table) == 0
    assert not math.isnan(len(table))


def test_grad_scaler_scale_overflow_and_unscaled_loss(tmp_path):
    out = tmp_path / "scaler"
    proc = stepscope_run(out, *python_script("torch_scaler.py"))
    assert proc.returncode == 0, proc.stderr
    table, _ = RunDir(out).read_steps()
    assert table["step"].tolist() == [0, 1, 2, 3, 4, 5]
    # step 3's optimizer step is skipped (inf gradient): still one row, flagged, and the
    # scaler halves its scale from step 4 on
    assert table["overflow"].tolist() == [0.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    assert table["loss_scale"].tolist() == [1024.0] * 4 + [512.0] * 2
    printed = [float(line.split("loss=")[1]) for line in proc.stdout.splitlines()]
    assert np.allclose(table["loss"], printed, atol=1e-6)  # unscaled, not x1024
    assert RunDir(out).read_meta().baseline["precision"] == "fp32 (GradScaler)"


def test_parse_steps_and_settings_from_env(monkeypatch):
    from stepscope.integrations.torch.auto import Settings, parse_steps

    # "a:b" has both ends included (stepscope._ranges); the profiler window is half-open
    assert parse_steps("3:5") == (3, 6)
    assert parse_steps("7") == parse_steps("7:7") == (7, 8)
    assert parse_steps("") is None
    with pytest.raises(ValueError):
        parse_steps("5:4")
    monkeypatch.delenv("STEPSCOPE_RUN_DIR", raising=False)
    assert Settings.from_env() is None
    monkeypatch.setenv("STEPSCOPE_RUN_DIR", "/tmp/x")
    monkeypatch.setenv("STEPSCOPE_MAX_STEPS", "9")
    monkeypatch.setenv("STEPSCOPE_REPLAY_DATA", "1")
    monkeypatch.setenv("STEPSCOPE_PROFILE_STEPS", "2:4")
    monkeypatch.setenv("STEPSCOPE_TOKENS_PER_STEP", "2048")
    s = Settings.from_env()
    assert s is not None
    assert (s.run_dir, s.max_steps, s.replay_data, s.profile_steps, s.tokens_per_step) == (
        "/tmp/x", 9, True, (2, 5), 2048.0)


def test_replay_cycles_first_batches_and_ends_epoch():
    from stepscope.integrations.torch.replay import Replay

    class It:  # the parts of _BaseDataLoaderIter that replay relies on
        def __init__(self, items):
            self._dataset = items
            self._num_yielded = 0
            self._src = iter(items)

        def __len__(self):
            return len(self._dataset)

    def orig(it):
        it._num_yielded += 1
        return next(it._src)

    def next_batch(rp, it):  # what the patched DataLoader iterator does
        hit, batch = rp.take(it)
        if not hit:
            batch = orig(it)
            rp.keep(it, batch)
        return batch

    rp = Replay(2)
    it = It(["a", "b", "c", "d", "e"])
    got = []
    with pytest.raises(StopIteration):
        while True:
            got.append(next_batch(rp, it))
    assert got == ["a", "b", "a", "b", "a"]
    it2 = It(["a", "b", "c", "d", "e"])  # next epoch: same loader, replayed from the start
    it2._dataset = it._dataset
    assert [next_batch(rp, it2) for _ in range(3)] == ["b", "a", "b"]


def test_hook_failure_never_reaches_training_and_sitecustomize_chains(tmp_path):
    # A site's own sitecustomize must still run after stepscope's.
    site = tmp_path / "site"
    site.mkdir()
    marker = tmp_path / "site-ran"
    (site / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('yes')\n")
    # A model whose parameters() raises: stepscope's forward hook fails on it; the
    # script, which never calls parameters() itself, must train to the end regardless.
    script = tmp_path / "weird.py"
    script.write_text(
        "import torch\n"
        "class Weird(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.w = torch.nn.Parameter(torch.ones(3))\n"
        "    def parameters(self, recurse=True):\n"
        "        raise RuntimeError('no parameters for you')\n"
        "    def forward(self, x):\n"
        "        return (self.w * x).sum()\n"
        "m = Weird()\n"
        "opt = torch.optim.SGD([m.w], lr=0.1)\n"
        "for i in range(4):\n"
        "    m(torch.ones(3)).backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n"
        "print('DONE', round(float(m.w[0]), 4))\n")
    out = tmp_path / "weird"
    import os
    import sys
    proc = stepscope_run(out, sys.executable, str(script),
                         env={"PYTHONPATH": str(site) + os.pathsep
                              + os.environ.get("PYTHONPATH", "")})
    assert proc.returncode == 0, proc.stderr
    assert "DONE 0.6" in proc.stdout  # 1 - 4 x 0.1: all four updates happened
    assert marker.read_text() == "yes"
    assert proc.stderr.count("stepscope: forward pre-hook failed") == 1  # warned once
    table, _ = RunDir(out).read_steps()
    assert table["step"].tolist() == [0, 1, 2, 3]
    assert RunDir(out).read_meta().config["hook_failures"] == 4


def test_torch_compile_model_is_measured(tmp_path):
    out = tmp_path / "compiled"
    proc = stepscope_run(out, *python_script("torch_compiled.py"))
    assert proc.returncode == 0, proc.stderr
    table, _ = RunDir(out).read_steps()
    assert table["step"].tolist() == [0, 1, 2, 3, 4]
    assert table["tokens"].tolist() == [32.0] * 5
    printed = [float(line.split("loss=")[1]) for line in proc.stdout.splitlines()]
    assert np.allclose(table["loss"], printed, atol=1e-6)
    assert RunDir(out).read_meta().config["hook_failures"] == 0


def test_nan_loss_is_recorded_as_nan_not_as_missing(tmp_path):
    script = tmp_path / "nan_loss.py"
    script.write_text(
        "import torch\n"
        "m = torch.nn.Linear(2, 1)\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.0)\n"
        "for i in range(4):\n"
        "    loss = m(torch.ones(1, 2)).sum() * (float('nan') if i == 2 else 1.0)\n"
        "    loss.backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n")
    out = tmp_path / "nan"
    import sys
    proc = stepscope_run(out, sys.executable, str(script))
    assert proc.returncode == 0, proc.stderr
    table, _ = RunDir(out).read_steps()
    # step 2's NaN gradients turn the weights NaN (0 x NaN = NaN), so step 3 is NaN too
    assert np.isfinite(table["loss"][:2]).all() and np.isnan(table["loss"][2:]).all()
    assert table["loss_nan"].tolist() == [0.0, 0.0, 1.0, 1.0]  # the training's own NaN
    assert np.isnan(table["grad_norm"][2])
