"""`stepscope mfu` refuses the impossible and prints FLOPs from a model alone."""

from __future__ import annotations

import pytest
from test_calc_cli import GPT2, LLAMA2_70B, run, run_json

from stepscope.calc.flops import ModelSpec, flops_per_token
from stepscope.record.host import cpu_peak_here


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


def test_precision_names_and_aliases(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["memory", "--params", "7B", "--json"]
    mixed = run_json(capsys, *base[:-1], "--precision", "bf16-mixed")
    assert mixed == run_json(capsys, *base[:-1], "--precision", "mixed") | {"precision":
                                                                             "bf16-mixed"}
    assert mixed["total_bytes"] == 16 * 7e9
    pure = run_json(capsys, *base[:-1], "--precision", "bf16-pure")
    assert pure["total_bytes"] == (2 + 2 + 4) * 7e9 and pure["precision"] == "bf16-pure"
    assert run_json(capsys, *base[:-1], "--precision", "bf16")["total_bytes"] == 8 * 7e9
    code, out, _ = run(capsys, "memory", "--help")
    assert code == 0 and "fp32 master" in out and "bf16-pure" in out


def test_fp32_grads_with_zero2(capsys: pytest.CaptureFixture[str]) -> None:
    bf16 = run_json(capsys, "memory", "--params", "7B", "--dp", "8", "--zero", "2")
    fp32 = run_json(capsys, "memory", "--params", "7B", "--dp", "8", "--zero", "2",
                    "--grad-dtype", "fp32")
    assert bf16["grads_bytes"] == 2 * 7e9 / 8 and fp32["grads_bytes"] == 4 * 7e9 / 8
    code, _, err = run(capsys, "memory", "--params", "7B", "--convention", "megatron",
                       "--grad-dtype", "bf16")
    assert code == 2 and "megatron convention" in err


def test_attention_scores_default_flash_and_stated(capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["memory", *LLAMA2_70B, "--tp", "8", "--sequence-parallel"]
    flash = run_json(capsys, *flags)
    stored = run_json(capsys, *flags, "--attention-scores", "stored")
    old = run_json(capsys, *flags, "--flash-attention")
    assert flash["attention_scores"] == "flash" and stored["attention_scores"] == "stored"
    assert old["activations_bytes"] == flash["activations_bytes"] < stored["activations_bytes"]
    code, out, _ = run(capsys, *flags)
    assert "attention scores not stored (flash/SDPA" in out


def test_context_parallel_splits_activations(capsys: pytest.CaptureFixture[str]) -> None:
    one = run_json(capsys, "memory", *LLAMA2_70B, "--tp", "8", "--dp", "8")
    four = run_json(capsys, "memory", *LLAMA2_70B, "--tp", "8", "--dp", "2", "--cp", "4",
                    "--zero", "1")
    assert four["activations_bytes"] == pytest.approx(one["activations_bytes"] / 4)
    code, _, err = run(capsys, "memory", *LLAMA2_70B, "--cp", "3")
    assert code == 2 and "context parallel size 3" in err


def test_expert_parallel_checks(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "memory", *LLAMA2_70B, "--dp", "8", "--ep", "2")
    assert code == 2 and "routed experts" in err
    moe = [*GPT2, "--moe-experts", "8", "--moe-top-k", "2"]
    code, _, err = run(capsys, "memory", *moe, "--dp", "2", "--ep", "4")
    assert code == 2 and "must divide DP x CP x TP" in err
    a = run_json(capsys, "memory", *moe, "--dp", "8", "--ep", "8", "--zero", "1")
    b = run_json(capsys, "memory", *moe, "--dp", "8", "--zero", "1")
    assert a["expert_params_per_device"] * 8 == b["expert_params_per_device"]


def test_vocabulary_padding_as_megatron() -> None:
    spec = ModelSpec(layers=12, hidden=768, heads=12, vocab=50257, seq_len=1024,
                     vocab_divisor=128)
    assert spec.padded_vocab(1) == 50304 and spec.padded_vocab(8) == 51200
    unpadded = ModelSpec(layers=12, hidden=768, heads=12, vocab=50257, seq_len=1024)
    assert unpadded.padded_vocab(8) == 50257
    gain = (flops_per_token(spec, "megatron", tp=8).flops_per_token
            - flops_per_token(unpadded, "megatron").flops_per_token)
    assert gain == 6 * 768 * (51200 - 50257)
