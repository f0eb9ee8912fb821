"""`stepscope mfu` refuses the impossible and prints FLOPs from a model alone (issue 11 item 7)."""

from __future__ import annotations

import pytest
from test_calc_cli import GPT2, LLAMA2_70B, run, run_json

from stepscope.calc.flops import ModelSpec, flops_per_token
from stepscope.envinfo import cpu_peak_here


def test_mfu_above_100_percent_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "mfu", *GPT2, "--tokens-per-s", "1e9", "--devices", "1",
                         "--device", "NVIDIA H100 80GB HBM3")
    assert code == 2 and out == "" and err.count("\n") == 1  # one line, no traceback
    for cause in ("MFU", "impossible", "device count", "sparsity", "units"):
        assert cause in err


def test_hfu_above_100_percent_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    # MFU 80% is possible; with full recompute HFU = 4/3 x MFU = 107% is not.
    fpt = flops_per_token(ModelSpec(layers=12, hidden=768, heads=12, vocab=50257,
                                    seq_len=1024, tied_embeddings=True,
                                    position_embeddings=1024)).flops_per_token
    tokens = 0.8 * 312e12 / fpt
    ok = run_json(capsys, "mfu", *GPT2, "--tokens-per-s", str(tokens), "--devices", "1",
                  "--peak-tflops", "312")
    assert ok["mfu"] == pytest.approx(0.8)
    code, _, err = run(capsys, "mfu", *GPT2, "--tokens-per-s", str(tokens), "--devices", "1",
                       "--peak-tflops", "312", "--recompute", "full")
    assert code == 2 and err.startswith("stepscope: error: HFU 106.7% is impossible")


def test_flops_only_from_a_shape(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(capsys, "mfu", *LLAMA2_70B, "--global-batch", "512")
    assert r["mfu"] is None and r["hfu"] is None
    by = r["by_convention"]
    assert isinstance(by, dict) and set(by) == {"palm", "megatron", "megatron-2022",
                                                "torchtitan", "6n"}
    assert r["flops_per_token"] == by["palm"]["flops_per_token"]
    assert r["flops_per_step"] == 512 * 4096 * r["flops_per_token"]  # type: ignore[operator]
    code, out, _ = run(capsys, "mfu", *LLAMA2_70B)
    assert code == 0 and "torchtitan" in out and "MFU/HFU: add --tokens-per-s" in out


def test_six_n_from_params_needs_nothing_else(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(capsys, "mfu", "--convention", "6n", "--params", "7B")
    assert r["flops_per_token"] == 42e9 and list(r["by_convention"]) == ["6n"]  # type: ignore
    r = run_json(capsys, "mfu", "--convention", "6n", "--params", "7B", "--tokens-per-s", "1e3",
                 "--devices", "1", "--peak-tflops", "312")
    assert r["mfu"] == pytest.approx(1e3 * 42e9 / 312e12)
    # Other conventions need the attention shape: said, not guessed.
    code, _, err = run(capsys, "mfu", "--params", "7B")
    assert code == 2 and "--layers" in err


def test_throughput_without_peak_or_devices(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "mfu", *GPT2, "--tokens-per-s", "1000", "--peak-tflops", "312")
    assert code == 2 and "--devices" in err


def test_cpu_peak_same_rule_in_cli_and_run(capsys: pytest.CaptureFixture[str]) -> None:
    entry, why = cpu_peak_here("fp32", threads=1)
    code, out, err = run(capsys, "mfu", *GPT2, "--tokens-per-s", "1", "--devices", "1",
                         "--device", "cpu", "--dtype", "fp32", "--cores", "1", "--json")
    if entry is None:  # a CPU without a defensible figure: the same reason in both
        assert code == 2 and why in err
        return
    import json

    r = json.loads(out)
    assert r["peak_flops_per_device"] == entry.flops and r["peak_source"] == entry.source
    assert "x 1 cores" in r["peak_source"]
