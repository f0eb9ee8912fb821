"""FLOPs counted from the network for any torch model (CNN, MLP, attention), with
torch.utils.flop_counter.FlopCounterMode on a real forward as the reference, and the MFU of
an image-classifier script under `stepscope run` (real torch on CPU)."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import stepscope.cli.report  # noqa: F401  (registers `report`)
from stepscope.cli import cli
from stepscope.integrations.torch.flopcount import counted_fields, forward_flops
from stepscope.rundir.store import RunDir
from support.torch_run import peak_args, python_script, stepscope_run

pytestmark = pytest.mark.xdist_group("torch_run")


def _cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1, groups=2), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(32 * 4 * 4, 10))


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(768, 256), nn.ReLU(), nn.Linear(256, 10))


class _Attn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
        self.ff = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff(self.attn(x, x, x, need_weights=False)[0])


def _reference(model: nn.Module, x: torch.Tensor) -> int:
    """FlopCounterMode on a real training forward (autograd on: under no_grad,
    nn.MultiheadAttention takes its inference fast path, another kernel)."""
    with FlopCounterMode(display=False) as c:
        model(x)
    return int(c.get_total_flops())


@pytest.mark.parametrize("make,shape", [(_cnn, (8, 3, 16, 16)), (_mlp, (8, 3, 16, 16))],
                         ids=["cnn", "mlp"])
def test_count_equals_flop_counter_mode_on_a_real_forward(make, shape) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model, x = make(), torch.randn(*shape)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fwd, note = forward_flops(model, (x,))
    # the model is untouched: its own tensors, same values (BatchNorm's running stats
    # too), same device
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) and after[k].device.type == "cpu"
               for k in before)
    assert fwd == _reference(model, x) > 0, note


def test_attention_core_is_counted_where_the_cpu_kernel_is_not() -> None:
    # On CPU, nn.MultiheadAttention runs SDPA's flash kernel for CPU, which FlopCounterMode
    # has no formula for (it counts 0 there); on meta tensors the math path runs and its
    # two batched matmuls are counted: QK^T and AV, 2 x B x L x S x E each.
    torch.manual_seed(0)
    model, x = _Attn(), torch.randn(4, 12, 32)
    fwd, _ = forward_flops(model, (x,))
    assert fwd == _reference(model, x) + 2 * (2 * 4 * 12 * 12 * 32)


def test_mlp_count_is_the_hand_count() -> None:
    # two matmuls: 2 x rows x in x out each (FlopCounterMode's convention, bias excluded)
    assert forward_flops(_mlp(), (torch.randn(8, 3, 16, 16),))[0] == \
        2 * 8 * 768 * 256 + 2 * 8 * 256 * 10


def test_a_model_that_cannot_run_on_meta_is_not_counted() -> None:
    class DataDependent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) * float(x.sum().item())

    fwd, note = forward_flops(DataDependent(), (torch.randn(2, 4),))
    assert fwd is None and note.startswith("not counted (")


def test_a_model_with_forward_hooks_of_its_own_is_not_run() -> None:
    """FSDP2, accelerate and DeepSpeed keep state in module hooks; stepscope's forward would
    change it (FSDP2's next real forward then failed), so such a model is left alone."""
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    calls: list[int] = []
    model[2].register_forward_pre_hook(lambda m, a: calls.append(1))
    fwd, why = forward_flops(model, (torch.zeros(4, 8),), {})
    assert fwd is None and "module 2 has forward hooks of its own" in why
    assert calls == []  # the hook never ran


def test_counted_fields_name_the_convention() -> None:
    f = counted_fields(1000, samples=4, tokens=None)
    assert f["flops_per_sample"] == 750.0 and "flops_per_token" not in f
    assert f["flops_convention"].startswith("counted: forward FLOPs x 3 (1,000 forward FLOPs")
    assert counted_fields(1000, samples=4, tokens=40)["flops_per_token"] == 75.0


@pytest.mark.parametrize("extra", [(), ("--mlp",)], ids=["cnn", "mlp"])
def test_image_classifier_under_stepscope_run_gets_an_mfu(tmp_path, extra) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "run"
    proc = stepscope_run(out, *python_script("torch_cnn.py", "--steps", "8", *extra),
                         args=peak_args())
    assert proc.returncode == 0, proc.stderr
    reference = int(next(ln.split()[1] for ln in proc.stdout.splitlines()
                         if ln.startswith("FLOPS ")))
    env = RunDir(out).read_meta().environment
    assert env["counted_forward_flops"] == reference
    assert env["flops_per_sample"] == 3 * reference / 16
    assert env["flops_convention"].startswith("counted: forward FLOPs x 3")
    assert "counted" in env["flops_by_convention"]
    res = CliRunner().invoke(cli, ["report", str(out), "--json", "--no-html"])
    assert res.exit_code == 0, res.output
    sheet = json.loads(res.output)
    assert sheet["tokens_per_s"] is None and sheet["samples_per_s"] > 0
    assert sheet["mfu"] == pytest.approx(
        sheet["samples_per_s"] * env["flops_per_sample"] / env["peak_flops_per_device"])
    assert sheet["mfu_note"].startswith("counted: forward FLOPs x 3")
    assert "; per sample;" in sheet["mfu_note"]


def test_given_peak_stands_before_the_table_and_a_bad_one_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`stepscope run --peak-tflops P`: the run's MFU is over P on any host (the only MFU on
    a CPU stepscope's table has no figure for); 0 or a word is refused before running."""
    out = tmp_path / "run"
    proc = stepscope_run(out, *python_script("torch_cnn.py", "--steps", "6", "--mlp"),
                         args=("--peak-tflops", "2.5"))
    assert proc.returncode == 0, proc.stderr
    env = RunDir(out).read_meta().environment
    assert env["peak_flops_per_device"] == 2.5e12
    assert env["peak_flops_source"] == "given: --peak-tflops 2.5 (STEPSCOPE_PEAK_TFLOPS)"
    sheet = json.loads(CliRunner().invoke(cli, ["report", str(out), "--json",
                                                "--no-html"]).output)
    assert sheet["mfu"] == pytest.approx(sheet["samples_per_s"] * env["flops_per_sample"]
                                         / 2.5e12)
    for bad in ("0", "fast"):
        proc = stepscope_run(tmp_path / f"bad-{bad}", *python_script("torch_cnn.py"),
                             args=("--peak-tflops", bad))
        assert proc.returncode == 2 and "--peak-tflops" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) <= 3 and not (tmp_path / f"bad-{bad}").exists()
