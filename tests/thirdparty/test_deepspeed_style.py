"""DeepSpeed ZeRO-1 and ZeRO-2 (scripts/deepspeed_style.py) under `stepscope run`, two ranks
on the CPU over gloo: optimizer steps, micro-batches per step, the loss DeepSpeed's backward
scales by 1/accumulation (recorded as the micro-batch mean) and ZeRO's global pre-clip
gradient norm (each rank's optimizer holds a partition only), checked per rank against
the script's own prints.

Needs the ``deepspeed`` extra; skipped where DeepSpeed is not installed.
"""

from __future__ import annotations

import math

import pytest

from support.script_log import THIRDPARTY_SCRIPTS, ScriptRun, printed
from support.torch_run import BIN, stepscope_run

pytest.importorskip("deepspeed")

pytestmark = pytest.mark.xdist_group("torch_run")


def _run(tmp: object, stage: int) -> tuple[ScriptRun, dict[tuple[int, int], dict]]:
    from pathlib import Path

    from stepscope.rundir.store import RunDir
    from stepscope.schema import StepTable

    out = Path(str(tmp)) / f"zero{stage}"
    proc = stepscope_run(out, str(BIN / "torchrun"), "--nproc_per_node", "2",
                         str(THIRDPARTY_SCRIPTS / "deepspeed_style.py"), "--stage",
                         str(stage), env={"DS_ACCELERATOR": "cpu"}, timeout=600)
    table = RunDir(out).read_steps()[0] if (out / "steps").is_dir() else StepTable.empty()
    own = printed(proc.stdout)
    run = ScriptRun(proc, own, out, table, {})
    return run, {(s["rank"], s["step"]): s for s in own.get("step", [])}


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_steps_loss_and_global_grad_norm_are_deepspeeds(
        tmp_path_factory: pytest.TempPathFactory, stage: int) -> None:
    run, own = _run(tmp_path_factory.mktemp("ds"), stage)
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    assert [d["steps"] for d in run.own["done"]] == [6, 6]  # 12 micro-batches / 2
    t = run.table
    rows = list(zip(t["rank"].tolist(), t["step"].tolist(), strict=True))
    assert sorted(rows) == sorted(own) and len(rows) == 12
    for i, key in enumerate(rows):
        mine = own[(int(key[0]), int(key[1]))]
        assert t["micro_batches"][i] == mine["micro"] == 2
        assert math.isclose(t["loss"][i], mine["loss"], rel_tol=1e-6), (key, mine)
        assert math.isclose(t["grad_norm"][i], mine["grad_norm"], rel_tol=1e-6), (key, mine)
        assert t["lr"][i] == mine["lr"]
