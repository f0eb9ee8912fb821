"""The thin torch adapter on a real CPU model."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from stepscope.integrations import torch as sst  # noqa: E402


def test_grad_norm_matches_clip_grad_norm() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    model(torch.randn(4, 8)).pow(2).sum().backward()
    ours = sst.grad_norm(model.parameters())
    ref = float(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))
    assert ours == pytest.approx(ref, rel=1e-6)
    assert math.isnan(sst.grad_norm(torch.nn.Linear(2, 2).parameters()))  # no grads yet


def test_batch_counts() -> None:
    ids = torch.zeros(4, 128, dtype=torch.long)
    assert sst.batch_counts(ids) == (512.0, 4.0)
    assert sst.batch_counts((ids, ids)) == (512.0, 4.0)
    assert sst.batch_counts({"labels": torch.zeros(4), "input_ids": ids}) == (512.0, 4.0)
    tokens, samples = sst.batch_counts([torch.randn(6, 3, 32, 32), torch.zeros(6)])
    assert math.isnan(tokens) and samples == 6.0


def test_cpu_memory_probe_reads_proc_not_cuda() -> None:
    probe, label = sst.memory_probe("cpu")
    peak, cur = probe()
    assert "RSS" in label and "cuda" not in label
    assert peak >= cur > 10 * 2**20  # a process with torch loaded holds > 10 MiB


def test_model_fingerprint_tracks_structure() -> None:
    a = sst.model_fingerprint(torch.nn.Linear(4, 4))
    b = sst.model_fingerprint(torch.nn.Linear(4, 4))
    c = sst.model_fingerprint(torch.nn.Linear(4, 5))
    assert a == b and a["num_params"] == 20
    assert c["model_structure_hash"] != a["model_structure_hash"] and c["num_params"] == 25


def test_environment_and_device() -> None:
    env = sst.environment("cpu")
    assert env["framework"] == "torch" and env["framework_version"] == torch.__version__
    info = sst.device_info("cpu")
    assert info["device_kind"] == "cpu" and info["num_devices"] == 1
    assert sst.sync_fn("cpu") is None
    from stepscope.record.host import cpu_peak_here

    peak, source = sst.peak_flops_for_device("cpu", "fp32")
    entry = cpu_peak_here("fp32", threads=torch.get_num_threads())[0]
    if entry is None:  # a CPU without a defensible figure: unavailable, never guessed
        assert peak is None and "--peak-tflops" in source
    else:
        assert (peak, source) == (entry.flops, entry.source)


def test_grad_scaler_scale_disabled_is_nan() -> None:
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    assert math.isnan(sst.grad_scaler_scale(scaler))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    assert sst.grad_scaler_scale(scaler) == 1024.0
