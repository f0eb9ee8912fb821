"""Hooks leave no trace on the user's objects: a script that saves, copies and pickles its
model and optimizer prints the same under `stepscope run` as without it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from support.script_log import THIRDPARTY_SCRIPTS, printed, run_under_stepscope

pytestmark = pytest.mark.xdist_group("torch_run")


def test_plain_run_of_the_fixture_saves_copies_and_pickles() -> None:
    proc = subprocess.run([sys.executable, str(THIRDPARTY_SCRIPTS / "objects_untouched.py")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    own = printed(proc.stdout)["objects"][0]
    assert own["torch_save_model"] == own["deepcopy_model"] == own["pickle_model"] == "ok"
    assert own["forward_pre_hooks"] == 0 and own["ema_equal"] is True


def test_objects_behave_exactly_as_without_stepscope(tmp_path) -> None:
    plain = subprocess.run([sys.executable, str(THIRDPARTY_SCRIPTS / "objects_untouched.py")],
                           capture_output=True, text=True, timeout=120)
    run = run_under_stepscope(tmp_path / "run", "objects_untouched.py")
    assert run.proc.returncode == 0, run.proc.stderr
    assert run.own["objects"] == printed(plain.stdout)["objects"]
    assert run.column("step") == [0, 1, 2, 3]  # and it was measured
