"""`plan` v2: framework constraints, a step-time model, launch settings."""

from __future__ import annotations

import re

import pytest
from test_calc_cli import LLAMA2_70B, run, run_json

from stepscope.calc.model import ModelSpec
from stepscope.calc.plan import plan
from stepscope.calc.steptime import LINKS, LayoutShape, Links, step_time

SPEC_70B = ModelSpec(layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672,
                     swiglu=True, vocab=32000, seq_len=4096)
H100 = ["--device", "NVIDIA H100 80GB HBM3"]
BASE = ["plan", *LLAMA2_70B, "--devices", "64", "--device-memory-gb", "80",
        "--global-batch", "512", *H100]


def _layouts(framework: str) -> list[dict[str, object]]:
    return [lay.to_dict() for lay in plan(SPEC_70B, 64, 80e9, 512, peak_flops=989.5e12,
                                          links=LINKS["H100 SXM"], framework=framework)]


def test_megatron_layouts_are_ones_megatron_accepts() -> None:
    layouts = _layouts("megatron")
    assert len(layouts) >= 10
    for lay in layouts:
        tp, pp, cp, dp = (int(lay[k]) for k in ("tp", "pp", "cp", "dp"))  # type: ignore
        mb = int(lay["micro_batch"])  # type: ignore[call-overload]
        assert lay["zero"] in (0, 1)  # only its distributed optimizer shards states
        assert tp <= 8 and 64 % tp == 0 and 8 % tp == 0  # heads 64, query groups 8
        assert 80 % pp == 0 and 4096 % (2 * cp) == 0 and 512 % (dp * mb) == 0
        assert lay["sequence_parallel"] == (tp > 1)
        settings = str(lay["settings"])
        assert f"--tensor-model-parallel-size {tp} " in settings
        assert ("--use-distributed-optimizer" in settings) == (lay["zero"] == 1)
        assert "--convention megatron" in str(lay["flags"])


def test_deepspeed_never_combines_zero2_3_with_pipeline() -> None:
    layouts = _layouts("deepspeed")
    assert any(lay["zero"] in (2, 3) for lay in layouts)
    assert all(lay["zero"] <= 1 for lay in layouts if int(lay["pp"]) > 1)  # type: ignore
    assert all(lay["zero"] <= 2 for lay in layouts if int(lay["tp"]) > 1)  # type: ignore
    assert all(lay["cp"] == 1 for lay in layouts)
    assert '"zero_optimization": {"stage": ' in str(layouts[0]["settings"])


def test_fsdp_and_mindspore_levels() -> None:
    fsdp = _layouts("fsdp")
    assert fsdp and all(lay["zero"] in (0, 2, 3) for lay in fsdp)
    assert "data_parallel_shard_degree" in str(fsdp[0]["settings"])
    ms = _layouts("mindspore")
    assert ms and all(lay["cp"] == 1 and lay["ep"] == 1 for lay in ms)
    assert all(lay["zero"] <= 1 for lay in ms if int(lay["pp"]) > 1)  # type: ignore
    assert "set_auto_parallel_context" in str(ms[0]["settings"])


def test_ranking_follows_the_estimate_and_note(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, *BASE, "--limit", "5")
    assert code == 0
    lines = [line for line in out.splitlines() if re.match(r"\s*\d+\. DP", line)]
    times = [float(line.split(": ")[1].split(" s/step")[0]) for line in lines]
    assert len(times) == 5 and times == sorted(times)
    note = out.splitlines()[-1]
    assert note.startswith("note: top five: #1 ") and "#5 " in note and "Llama 3" in note
    assert re.search(r"best estimate \(MFU [\d.]+%\) is (above|within|below) the 38%-52%",
                     note)


def test_moe_plan_uses_expert_parallelism(capsys: pytest.CaptureFixture[str]) -> None:
    mixtral = ["--layers", "32", "--hidden", "4096", "--heads", "32", "--kv-heads", "8",
               "--ffn-hidden", "14336", "--swiglu", "--vocab", "32000", "--seq-len", "4096",
               "--moe-experts", "8", "--moe-top-k", "2"]
    r = run_json(capsys, "plan", *mixtral, "--devices", "64", "--device-memory-gb", "80",
                 "--global-batch", "256", *H100)
    layouts = r["layouts"]
    assert isinstance(layouts, list)
    eps = {lay["ep"] for lay in layouts}
    assert eps > {1} and all(8 % int(e) == 0 for e in eps)
    lay = next(lay for lay in layouts if lay["ep"] > 1)
    mem = run_json(capsys, *lay["memory_command"].split()[1:])
    assert mem["total_bytes"] == lay["memory"]["total_bytes"]


def _shape(**kw: object) -> LayoutShape:
    base: dict[str, object] = dict(dp=1, tp=1, pp=1, cp=1, ep=1, zero=0, recompute="none",
                                   micro_batch=1, num_microbatches=8, grad_bytes=2.0,
                                   dense_params=0.0, expert_params=0.0)
    base.update(kw)
    return LayoutShape(**base)  # type: ignore[arg-type]


def test_step_time_bubble_and_compute() -> None:
    spec = ModelSpec(layers=8, hidden=1024, heads=8, vocab=1000, seq_len=1024)
    fast = Links(1e30, 1e30, "ideal")
    args = dict(global_batch=64, peak_flops=1e12, model_flops_per_token=1e9,
                hardware_flops_per_token=1e9, links=fast)
    one = step_time(spec, _shape(dp=4), **args)  # type: ignore[arg-type]
    assert one.compute_s == pytest.approx(64 * 1024 * 1e9 / (4 * 1e12 * 0.5))
    assert one.step_s == pytest.approx(one.compute_s) and one.mfu == pytest.approx(0.5)
    piped = step_time(spec, _shape(pp=4, num_microbatches=8), **args)  # type: ignore[arg-type]
    # bubble share of the step = (p-1)/(m+p-1)
    assert piped.bubble_s / piped.step_s == pytest.approx(3 / 11)


def test_step_time_tp_message_sizes() -> None:
    spec = ModelSpec(layers=8, hidden=1024, heads=8, vocab=1000, seq_len=1024)
    links = Links(100e9, 10e9, "test")
    est = step_time(spec, _shape(tp=4, num_microbatches=2), global_batch=2, peak_flops=1e15,
                    model_flops_per_token=1e9, hardware_flops_per_token=1e9, links=links)
    # 4 all-reduces of s*b*h*2 bytes per layer per micro-batch, 2(t-1)/t of it per rank.
    expected = 8 * 2 * 4 * 2 * 3 / 4 * (1024 * 1024 * 2) / 100e9
    assert est.comm["tp"] == pytest.approx((expected, expected))
    across = step_time(spec, _shape(tp=4, num_microbatches=2), global_batch=2,
                       peak_flops=1e15, model_flops_per_token=1e9,
                       hardware_flops_per_token=1e9, links=links, devices_per_node=2)
    assert across.comm["tp"][0] == pytest.approx(expected * 10)  # over the slower link


def test_plan_from_hf_config_prints_a_pasteable_command(
        capsys: pytest.CaptureFixture[str]) -> None:
    from test_calc_hf_config import CONFIGS

    path = str(CONFIGS / "mixtral-8x7b-v0.1.json")
    r = run_json(capsys, "plan", "--hf-config", path, "--seq-len", "4096", "--devices", "32",
                 "--device-memory-gb", "80", "--global-batch", "128", *H100)
    layouts = r["layouts"]
    assert isinstance(layouts, list) and layouts
    command = layouts[0]["memory_command"]
    assert command.startswith(f"stepscope memory --hf-config {path} --seq-len 4096 ")
    mem = run_json(capsys, *command.split()[1:])
    assert mem["total_bytes"] == layouts[0]["memory"]["total_bytes"]
