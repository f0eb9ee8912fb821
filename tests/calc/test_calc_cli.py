"""`stepscope mfu / memory / plan`: flags, --json keys, plan-memory consistency, errors."""

from __future__ import annotations

import json

import pytest

from stepscope.calc.flops import ModelSpec
from stepscope.calc.memory import estimate
from stepscope.calc.plan import plan
from stepscope.cli import main
from stepscope.cli.calc import parse_number

LLAMA2_70B = ["--layers", "80", "--hidden", "8192", "--heads", "64", "--kv-heads", "8",
              "--ffn-hidden", "28672", "--swiglu", "--vocab", "32000", "--seq-len", "4096"]
GPT2 = ["--layers", "12", "--hidden", "768", "--heads", "12", "--vocab", "50257",
        "--seq-len", "1024", "--tied-embeddings", "--position-embeddings", "1024"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    result: dict[str, object] = json.loads(out)
    return result


@pytest.mark.parametrize(("text", "value"), [
    ("7e9", 7e9), ("7B", 7e9), ("7000M", 7e9), ("7b", 7e9), ("32k", 32e3), ("1.5T", 1.5e12),
    ("4096", 4096.0), ("7G", 7e9)])
def test_parse_number(text: str, value: float) -> None:
    assert parse_number(text) == value


def test_parse_number_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="not a number"):
        parse_number("seven")


def test_mfu_json_keys_and_values(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(capsys, "mfu", *GPT2, "--step-time", "0.755", "--global-batch", "100",
                 "--devices", "1", "--device", "NVIDIA A100-SXM4-80GB")
    assert {"flops_per_token", "hardware_flops_per_token", "mfu", "hfu",
            "peak_flops_per_device", "convention"} <= set(r)
    assert r["flops_per_token"] == 6 * (124_337_664 - 786_432) + 12 * 12 * 768 * 1024
    assert r["convention"] == "palm" and r["peak_flops_per_device"] == 312e12
    assert r["mfu"] == pytest.approx(100 * 1024 / 0.755 * r["flops_per_token"] / 312e12)
    assert r["hfu"] == r["mfu"]


def test_mfu_params_path_and_recompute(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(capsys, "mfu", "--params", "540.35B", "--layers", "118", "--hidden", "18432",
                 "--heads", "48", "--head-dim", "256", "--seq-len", "2048",
                 "--tokens-per-s", "238300", "--devices", "6144", "--peak-tflops", "275",
                 "--recompute", "full", "--recompute-fraction", "0.75")
    assert round(float(r["mfu"]) * 100, 1) == 46.2  # type: ignore[arg-type]
    assert round(float(r["hfu"]) * 100, 1) == 57.8  # type: ignore[arg-type]
    r = run_json(capsys, "mfu", *LLAMA2_70B, "--tokens-per-s", "1e5", "--devices", "64",
                 "--device", "NVIDIA H100 80GB HBM3", "--convention", "megatron",
                 "--recompute", "selective")
    assert r["convention"] == "megatron" and r["causal"] is True
    assert float(r["hfu"]) > float(r["mfu"])  # type: ignore[arg-type]


def test_mfu_grad_accum_does_not_distort(capsys: pytest.CaptureFixture[str]) -> None:
    # 8 devices, micro-batch 4, 16 accumulation steps: 512 sequences per optimizer step.
    base = ["mfu", *GPT2, "--devices", "8", "--device", "NVIDIA H100 80GB HBM3"]
    a = run_json(capsys, *base, "--step-time", "2.0", "--global-batch", "512")
    b = run_json(capsys, *base, "--tokens-per-s", str(512 * 1024 / 2.0))
    assert a["mfu"] == b["mfu"]


@pytest.mark.parametrize(("args", "needle"), [
    (["--device", "NVIDIA H10"], "close names"),
    (["--device", "Ascend910B2"], "no first-party"),
    (["--device", "Tesla V100-SXM2-32GB"], "no bf16"),
    ([], "--peak-tflops"),
])
def test_mfu_peak_errors(capsys: pytest.CaptureFixture[str], args: list[str],
                         needle: str) -> None:
    code, _, err = run(capsys, "mfu", *GPT2, "--tokens-per-s", "1000", "--devices", "1", *args)
    assert code == 2 and needle in err and "--peak-tflops" in err
    assert err.count("\n") == 1  # one line, no traceback


def test_memory_json_keys_and_zero(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(capsys, "memory", "--params", "7B", "--dp", "8", "--zero", "2")
    keys = ["weights_bytes", "grads_bytes", "optimizer_bytes", "model_states_bytes",
            "activations_bytes", "total_bytes"]
    assert [r[k] for k in keys] == [14e9, 14e9 / 8, 84e9 / 8, 26.25e9, 0.0, 26.25e9]


@pytest.mark.parametrize(("args", "needle"), [
    (["--tp", "3"], "must divide the 64 attention heads"),
    (["--pp", "81"], "exceeds the 80 layers"),
    (["--offload", "params", "--zero", "2"], "needs --zero 3"),
    (["--zero", "2", "--convention", "megatron"], "ZeRO-1 only"),
    (["--precision", "fp32", "--convention", "megatron"], "mixed-precision Adam"),
    (["--zero", "2", "--tp", "2", "--convention", "deepspeed"], "pure data parallel"),
    (["--zero", "1", "--convention", "deepspeed"], "stages 2 and 3"),
])
def test_memory_impossible_layouts(capsys: pytest.CaptureFixture[str], args: list[str],
                                   needle: str) -> None:
    code, _, err = run(capsys, "memory", *LLAMA2_70B, *args)
    assert code == 2 and needle in err


H100 = ["--device", "NVIDIA H100 80GB HBM3"]


def test_plan_70b_on_64x80gb_agrees_with_memory(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(capsys, "plan", *LLAMA2_70B, "--devices", "64", "--device-memory-gb", "80",
                 "--global-batch", "512", *H100)
    layouts = r["layouts"]
    assert isinstance(layouts, list) and len(layouts) >= 5
    budget = 80e9 * 0.9
    for lay in layouts:
        assert lay["dp"] * lay["tp"] * lay["pp"] * lay["cp"] == 64
        assert lay["memory"]["total_bytes"] <= budget
    # Ranked by the estimated step time, fastest first.
    times = [lay["estimate"]["step_s"] for lay in layouts]
    assert times == sorted(times)
    # The printed command through `stepscope memory` gives the same bytes, for a sample.
    for lay in layouts[:: max(1, len(layouts) // 6)]:
        argv = lay["memory_command"].split()
        assert argv[:2] == ["stepscope", "memory"]
        mem = run_json(capsys, *argv[1:])
        assert {k: mem[k] for k in lay["memory"]} == lay["memory"]


def test_plan_python_matches_estimate() -> None:
    from stepscope.calc.steptime import LINKS

    spec = ModelSpec(layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672,
                     swiglu=True, vocab=32000, seq_len=4096)
    layouts = plan(spec, 64, 80e9, 512, peak_flops=989.5e12, links=LINKS["H100 SXM"],
                   framework="deepspeed")
    best = layouts[0]
    again = estimate(spec, dp=best.dp, tp=best.tp, pp=best.pp, zero=best.zero,
                     micro_batch=best.micro_batch, recompute=best.recompute,
                     sequence_parallel=best.sequence_parallel,
                     num_microbatches=best.num_microbatches, flash_attention=True)
    assert again == best.memory
    # 70B in mixed-precision Adam: 16 B/param = 1.1 TB of states; no single layout without
    # sharding fits, every feasible one shards states (ZeRO or PP/TP).
    assert all(lay.zero >= 1 or lay.tp * lay.pp > 1 for lay in layouts)


def test_plan_nothing_fits(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "plan", *LLAMA2_70B, "--devices", "2",
                       "--device-memory-gb", "24", "--global-batch", "8", *H100)
    assert code == 2 and "no layout fits" in err and "smallest needs" in err


def test_plan_needs_a_peak_for_the_time(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "plan", *LLAMA2_70B, "--devices", "64",
                       "--device-memory-gb", "80", "--global-batch", "512")
    assert code == 2 and "estimated step time" in err and "--device" in err
    code, _, err = run(capsys, "plan", *LLAMA2_70B, "--devices", "64", "--device-memory-gb",
                       "80", "--global-batch", "512", "--peak-tflops", "400")
    assert code == 2 and "--intra-node-gbps" in err
