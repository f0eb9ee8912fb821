"""MindSpore FLOPs attached without the user passing them (integrations/mindspore/autoflops):
tutorial-style LeNet-5 and quick-start MLP scripts (tests/scripts/ms_auto_flops.py) on real
MindSpore 2.10 CPU, through the callback and under `stepscope run`. Each run's FLOPs per
sample equal a hand count of the layers, its MFU follows from them, its losses equal the
script's own, and equal those of the same script run without stepscope (the count's
forward moves no BatchNorm statistics and draws no dropout). A network it cannot count
says why, and trains on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import stepscope.cli.report  # noqa: F401  (registers `report`)
from stepscope.cli import cli
from stepscope.rundir.store import RunDir
from support.script_log import printed
from support.torch_run import BIN, peak_env, stepscope_run

pytest.importorskip("mindspore")
pytestmark = [pytest.mark.xdist_group("mindspore"), pytest.mark.mindspore, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ms_auto_flops.py"
ENV = {"GLOG_v": "3", "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **peak_env()}

# Hand counts (multiply-add = 2 FLOPs, biases not counted), per batch.
B_CNN, B_MLP = 8, 16
CNN = (2 * B_CNN * 6 * (28 * 28) * 1 * (5 * 5)       # conv1 32x32 -> 28x28, valid
       + 2 * B_CNN * 16 * (10 * 10) * 6 * (5 * 5)    # conv2 14x14 -> 10x10
       + 2 * B_CNN * (400 * 120 + 120 * 84 + 84 * 10))
MLP = 2 * B_MLP * (784 * 64 + 64 * 64 + 64 * 10)
FORWARD = {"cnn": (CNN, B_CNN), "mlp": (MLP, B_MLP)}


def _losses(stdout: str) -> list[float]:
    return [s["loss"] for s in printed(stdout).get("step", [])]


def _bare(tmp_path: Path, net: str, mode: str) -> list[float]:
    p = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "bare"), net, mode],
                       capture_output=True, text=True, timeout=300, env={**os.environ, **ENV})
    assert p.returncode == 0, p.stderr[-2000:]
    return _losses(p.stdout)


def _callback(tmp_path: Path, net: str, mode: str) -> tuple[Path, list[float]]:
    run_dir = tmp_path / "cb"
    p = subprocess.run([sys.executable, str(SCRIPT), str(run_dir), net, mode, "--callback"],
                       capture_output=True, text=True, timeout=300, env={**os.environ, **ENV})
    assert p.returncode == 0, p.stderr[-2000:]
    return run_dir, _losses(p.stdout)


def _zero_code(tmp_path: Path, net: str, mode: str) -> tuple[Path, list[float]]:
    out = tmp_path / "zc"
    p = stepscope_run(out, sys.executable, str(SCRIPT), str(out), net, mode, env=ENV,
                      timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return out, _losses(p.stdout)


def _sheet(run_dir: Path) -> dict[str, Any]:
    res = CliRunner().invoke(cli, ["report", str(run_dir), "--json", "--no-html"])
    assert res.exit_code == 0, res.output
    out: dict[str, Any] = json.loads(res.output)
    return out


def _check_counted(run_dir: Path, net: str, own: list[float]) -> None:
    table, _ = RunDir.open(run_dir).read_steps()
    assert table["loss"].tolist() == own
    meta = RunDir.open(run_dir).read_meta()
    forward, batch = FORWARD[net]
    env = meta.environment
    assert env["counted_forward_flops"] == forward
    assert env["flops_per_sample"] == 3 * forward / batch
    assert env["flops_convention"].startswith(f"counted: forward FLOPs x 3 ({forward:,} ")
    assert meta.config["flops_counted"] == "from the network and the first batch's shapes"
    sheet = _sheet(run_dir)
    assert sheet["mfu"] == pytest.approx(
        sheet["samples_per_s"] * env["flops_per_sample"] / env["peak_flops_per_device"])
    assert sheet["mfu_note"].startswith("counted: forward FLOPs x 3")


@pytest.mark.parametrize(("net", "mode"), [("cnn", "model"), ("mlp", "model"),
                                           ("cnn", "traincell")])
def test_callback_counts_the_network_and_leaves_training_as_it_was(
        tmp_path: Path, net: str, mode: str) -> None:
    run_dir, own = _callback(tmp_path, net, mode)
    assert len(own) == 4 and own == _bare(tmp_path, net, mode)
    _check_counted(run_dir, net, own)


@pytest.mark.parametrize(("net", "mode"), [("cnn", "model"), ("mlp", "loop"),
                                           ("cnn", "loop")])
def test_stepscope_run_counts_the_network(tmp_path: Path, net: str, mode: str) -> None:
    out, own = _zero_code(tmp_path, net, mode)
    assert len(own) == 4 and own == _bare(tmp_path, net, mode)
    _check_counted(out, net, own)


def test_a_training_cell_with_no_known_forward_says_why_and_trains_on(tmp_path: Path) -> None:
    run_dir, own = _callback(tmp_path, "mlp", "customcell")
    table, _ = RunDir.open(run_dir).read_steps()
    assert table["loss"].tolist() == own and len(own) == 4
    meta = RunDir.open(run_dir).read_meta()
    assert "flops_per_sample" not in meta.environment
    why = ("FLOPs not counted, so no MFU: Model was given the training cell CustomTrainCell "
           "and no loss_fn: its forward network is not known (running the cell would train "
           "it)")
    assert meta.config["flops_counted"] == why
    warnings, _ = RunDir.open(run_dir).read_events("warning")
    assert why in [w["message"] for w in warnings]
    assert _sheet(run_dir)["mfu"] is None
