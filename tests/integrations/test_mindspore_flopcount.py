"""FLOPs counted from MindSpore networks (real MindSpore 2.10 on CPU) equal a hand count
of the same layers, in PyNative and GRAPH mode, and a LoopRecorder run carrying them gets
an MFU per sample with the convention named."""

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
from stepscope.integrations.mindspore.flopcount import (
    attention_flops,
    conv_flops,
    dense_flops,
)
from stepscope.rundir.store import RunDir
from support.torch_run import peak_env

pytest.importorskip("mindspore")
pytestmark = [pytest.mark.xdist_group("mindspore"), pytest.mark.mindspore, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ms_flops.py"
B = 8  # the script's batch; images 3x16x16

# Hand counts of tests/scripts/ms_flops.py's layers (multiply-add = 2, bias not counted):
CNN = {"conv1": 2 * B * 16 * (16 * 16) * 3 * (3 * 3),        # same padding: 16x16 out
       "conv2": 2 * B * 32 * (8 * 8) * (16 // 2) * (3 * 3),  # stride 2, 2 groups
       "dense": 2 * B * (32 * 8 * 8) * 10}
MLP = {"1": 2 * B * 768 * 256, "3": 2 * B * 256 * 10}
# batch 4, 12 queries over 20 keys/values, embed 32: q/k/v projections, QK^T and AV, out
ATTN = 2 * 4 * (12 * 32 * 32 + 2 * 20 * 32 * 32) + 2 * 2 * 4 * 12 * 20 * 32 + 2 * 4 * 12 * 32 * 32


def _run(run_dir: Path, *args: str) -> dict[str, Any]:
    p = subprocess.run([sys.executable, str(SCRIPT), str(run_dir), *args], cwd=run_dir.parent,
                       capture_output=True, text=True, timeout=300, check=False,
                       env={**os.environ, **peak_env()})
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("{")][-1])


def test_formulas_are_the_hand_counts() -> None:
    assert dense_flops(8, 768, 256) == MLP["1"]
    assert conv_flops(B, 32, (8, 8), 8, (3, 3)) == CNN["conv2"]
    assert attention_flops(4, 12, 20, 32) == ATTN


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_counts_equal_the_hand_count_and_the_run_gets_an_mfu(tmp_path: Path, mode: str) -> None:
    run_dir = tmp_path / mode
    out = _run(run_dir, *(("--graph",) if mode == "graph" else ()))
    assert out["cnn"] == {"total": sum(CNN.values()), "by_cell": CNN}
    assert out["mlp"] == {"total": sum(MLP.values()), "by_cell": MLP}
    assert out["attn"]["total"] == ATTN
    res = CliRunner().invoke(cli, ["report", str(run_dir), "--json", "--no-html"])
    assert res.exit_code == 0, res.output
    sheet = json.loads(res.output)
    assert sheet["tokens_per_s"] is None and sheet["samples_per_s"] > 0
    per_sample = 3 * sum(CNN.values()) / B
    env = RunDir.open(run_dir).read_meta().environment
    assert env["flops_per_sample"] == per_sample
    assert sheet["mfu"] == pytest.approx(
        sheet["samples_per_s"] * per_sample / env["peak_flops_per_device"])
    assert sheet["mfu_note"].startswith("counted: forward FLOPs x 3 (4,456,448 forward FLOPs")
    assert "nn.Conv2d, nn.Dense" in sheet["mfu_note"] and "; per sample;" in sheet["mfu_note"]
