"""`stepscope run` writes RUN/report.html when the command ends, best effort: the page a
real Chromium draws, and never at the cost of the training's exit status, a hang or a
temporary file left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from stepscope.cli.run_html import _remove_leftovers, write_after_run
from stepscope.rundir.store import RunDir
from support.browser import embedded, offline_page
from support.procs import Live, clean_env, no_traceback
from support.torch_run import BIN, python_script, stepscope_run

pytestmark = pytest.mark.slow
SMALL = ("--batch", "4", "--seq", "16")


def _tmp_files(run: Path) -> list[str]:
    return [str(p.relative_to(run)) for p in run.rglob("*") if p.name.endswith(".tmp")]


def test_run_writes_a_report_the_browser_draws(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = stepscope_run(run, *python_script("torch_plain.py", "--steps", "12", *SMALL),
                         args=("--json",), timeout=240)
    assert proc.returncode == 0, proc.stderr
    outcome = orjson.loads(proc.stdout.strip().splitlines()[-1])
    assert outcome["html"] == str(run / "report.html") and outcome["html_note"] is None
    doc = embedded(run / "report.html")
    assert doc["run"]["meta"]["status"] == "finished"
    assert doc["series"]["series"]["efficiency/step_time_s"]["steps"] == list(range(12))
    with offline_page(run / "report.html", "report-after-run") as page:
        assert page.evaluate("charts.length") >= 5
        assert page.evaluate("charts.every(c => c.data[1].some(v => v !== null))")
    assert _tmp_files(run) == []


def test_no_html_writes_none_and_says_nothing_of_it(tmp_path: Path) -> None:
    run, proc = _small_run(tmp_path)
    assert not (run / "report.html").exists()
    assert "report" not in proc.stderr


TRAIN_THEN_LOSE_THE_DIR = """\
import glob, os, subprocess, sys, time, torch
m = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(20):
    loss = m(torch.randn(4, 8)).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
run = os.environ["STEPSCOPE_RUN_DIR"]
end = time.monotonic() + 60  # the recorder's writer thread has written steps
while not any(os.path.getsize(f) for f in glob.glob(run + "/steps/rank-*.jsonl")):
    assert time.monotonic() < end
    time.sleep(0.05)
if os.geteuid() == 0:  # root writes through permissions, not into an immutable directory
    subprocess.run(["chattr", "+i", run], check=True, capture_output=True)
else:
    os.chmod(run, 0o555)
sys.exit(7)
"""


def test_an_unwritable_run_dir_keeps_the_trainings_exit_status(tmp_path: Path) -> None:
    """Nothing can be created in RUN once the training ends (not run.json's final status,
    not the cache, not report.html): `stepscope run` says so and exits 7, as the script."""
    root = os.geteuid() == 0
    probe = tmp_path / "probe"
    probe.mkdir()
    if root and subprocess.run(["chattr", "+i", str(probe)], capture_output=True,
                               timeout=30).returncode != 0:
        pytest.skip("this file system has no immutable directories (chattr +i)")
    if root:
        subprocess.run(["chattr", "-i", str(probe)], check=True, timeout=30)
    train = tmp_path / "train.py"
    train.write_text(TRAIN_THEN_LOSE_THE_DIR)
    run = tmp_path / "run"
    try:
        proc = stepscope_run(run, sys.executable, str(train), timeout=240)
        no_traceback(proc)
        assert proc.returncode == 7, proc.stderr  # the training's, not the report's
        (line,) = [ln for ln in proc.stderr.splitlines() if "report.html" in ln]
        assert line.startswith("stepscope: report.html not written: cannot write "), line
        assert ("Operation not permitted" if root else "Permission denied") in line, line
        assert not (run / "report.html").exists() and _tmp_files(run) == []
    finally:
        if root:
            subprocess.run(["chattr", "-i", str(run)], capture_output=True, timeout=30)
        else:
            run.chmod(0o755)


def test_sigterm_while_the_report_is_made_ends_it_and_keeps_the_status(
        tmp_path: Path) -> None:
    """A scheduler's SIGTERM after the training ended (a job at its time limit) stops the
    report's process, leaves no temporary file and exits with the training's status."""
    run = tmp_path / "run"
    live = Live([str(BIN / "stepscope"), "run", "--out", str(run), "--",
                 *python_script("torch_plain.py", "--steps", "3", *SMALL)],
                env=clean_env())
    deadline = time.monotonic() + 240
    child = None
    while child is None:
        assert live.proc.poll() is None, live.stderr  # ended before the report started
        assert time.monotonic() < deadline, live.stderr
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                try:
                    cmd = (p / "cmdline").read_bytes()
                except OSError:
                    continue
                if b"stepscope.cli.run_html\0" + str(run).encode() in cmd:
                    child = int(p.name)
        time.sleep(0.02)
    os.kill(live.proc.pid, signal.SIGTERM)  # stepscope run only, as a scheduler would
    assert live.wait(60) == 0, live.stderr
    no_traceback(subprocess.CompletedProcess([], 0, live.stdout, live.stderr))
    assert "stepscope: report.html not written: stopped by SIGTERM" in live.stderr
    assert not Path(f"/proc/{child}").exists()  # ended and reaped
    assert _tmp_files(run) == []


def _small_run(tmp_path: Path) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A 3-step run recorded with --no-html, and its `stepscope run` process."""
    run = tmp_path / "small"
    proc = stepscope_run(run, *python_script("torch_plain.py", "--steps", "3", *SMALL),
                         args=("--no-html",), timeout=240)
    assert proc.returncode == 0, proc.stderr
    return run, proc


def test_a_report_past_its_bounds_is_not_waited_for(tmp_path: Path) -> None:
    run, _ = _small_run(tmp_path)
    path, note = write_after_run(run, max_bytes=64)
    assert path is None and note is not None
    assert "of step records is more than the end of a run reads" in note
    assert f"`stepscope report {run}` writes it" in note
    started = time.monotonic()
    path, note = write_after_run(run, timeout_s=0.2)  # less than the child's start-up
    assert path is None and note is not None and note.startswith("not done in 0.2 s")
    assert time.monotonic() - started < 15  # bounded: stopped, not waited for
    assert not (run / "report.html").exists() and _tmp_files(run) == []
    path, note = write_after_run(run)
    assert note is None and path == run / "report.html" and path.is_file()


def test_leftovers_of_ended_writers_go_and_a_live_writers_stay(tmp_path: Path) -> None:
    run, _ = _small_run(tmp_path)
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, timeout=60)
    dead = int(ended.stdout)
    (run / ".cache" / "steps").mkdir(parents=True, exist_ok=True)
    gone = [run / f".report.html.{dead}.tmp",
            run / ".cache" / "steps" / f".rank-00000.jsonl.json.{dead}.tmp"]
    kept = run / f".report.html.{os.getpid()}.tmp"
    for p in [*gone, kept]:
        p.write_text("partial")
    _remove_leftovers(RunDir(run))
    assert [p.exists() for p in gone] == [False, False] and kept.exists()
