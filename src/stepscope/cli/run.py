"""``stepscope run``: zero-code instrumentation of a training command.

Example::

    stepscope run --out runs/exp1 -- python train.py --lr 3e-4
    stepscope run --out runs/ddp --profile-steps 10:12 -- torchrun --nproc_per_node 2 train.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from ..launcher.supervise import DEFAULT_GRACE_S
from . import cli
from .common import emit_json


@cli.command(
    "run",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option("--out", "out", type=click.Path(file_okay=False), default=None,
              help="Run directory (default: runs/<name>-<UTC timestamp>). A directory that "
                   "already holds a run is refused (exit 2): a run is never overwritten.")
@click.option("--name", default="", help="Run name stored in run.json.")
@click.option("--profile-steps", default=None, metavar="A:B",
              help="Capture a torch.profiler trace of steps A..B, both ends included (the "
                   "convention of every a:b flag: 10:12 is steps 10, 11 and 12), per rank "
                   "into RUN/profiles/<UTC timestamp>/ and analyse it.")
@click.option("--max-steps", type=int, default=0,
              help="Stop the script cleanly after this many optimizer steps (0 = no limit).")
@click.option("--tokens-per-step", type=float, default=None,
              help="Tokens per step per rank, when the batch does not show them.")
@click.option("--samples-per-step", type=float, default=None,
              help="Samples per step per rank, when the batch does not show them.")
@click.option("--cross-rank-every", type=int, default=None,
              help="Steps between cross-rank gathers (default 20; 0 = off).")
@click.option("--grace-s", type=click.FloatRange(min=0), default=DEFAULT_GRACE_S,
              show_default=True,
              help="After forwarding SIGINT/SIGTERM/SIGHUP/SIGQUIT, seconds the command gets "
                   "to exit before it is killed (the schedulers' usual grace).")
@click.option("--alerts", "alerts_file", type=click.Path(dir_okay=False), default=None,
              help="Alert file (TOML): live rules, stall watchdog and chat webhooks in every "
                   "rank (default: $STEPSCOPE_ALERTS).")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None, metavar="PORT",
              help="Serve Prometheus /metrics per rank on 127.0.0.1:PORT + local rank "
                   "(printed on stderr; STEPSCOPE_METRICS_ADDR=0.0.0.0 serves other hosts).")
@click.option("--flops-convention", default=None, metavar="NAME",
              help="FLOPs convention of the run's MFU: matmul (default: 6 x matmul "
                   "parameters, embedding lookups left out), palm, torchtitan, 6n, megatron, "
                   "megatron-2022 (those with an attention term need model.config's shape), "
                   "counted (forward FLOPs counted on the model x 3; the default when no "
                   "token ids are seen, e.g. CNNs and MLPs).")
@click.option("--peak-tflops", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="P",
              help="Dense peak TFLOP/s per device for the run's MFU, over stepscope's device "
                   "table (a CPU or accelerator it has no figure for).")
@click.option("--tensorboard", "tensorboard_dir", type=click.Path(file_okay=False),
              default=None, metavar="DIR",
              help="Also write the per-step series live to TensorBoard event files in DIR "
                   "(one per rank; `stepscope export` adds the job-level series after).")
@click.option("--mlflow", "mlflow_uri", default=None, metavar="URI",
              help="Also log the per-step series live to an MLflow run at this tracking "
                   "URI (e.g. sqlite:///mlflow.db), written by rank 0.")
@click.option("--mlflow-experiment", default="stepscope", show_default=True,
              help="MLflow experiment of --mlflow (created if absent).")
@click.option("--no-html", is_flag=True,
              help="Do not write RUN/report.html when the command ends (it is written best "
                   "effort: a failure is one line and never changes the exit status).")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def run_cmd(out: str | None, name: str, profile_steps: str | None, max_steps: int,
            tokens_per_step: float | None, samples_per_step: float | None,
            cross_rank_every: int | None, flops_convention: str | None,
            peak_tflops: float | None, grace_s: float,
            alerts_file: str | None, metrics_port: int | None, tensorboard_dir: str | None,
            mlflow_uri: str | None, mlflow_experiment: str, no_html: bool, as_json: bool,
            command: tuple[str, ...]) -> None:
    """Run COMMAND (after `--`) with per-step recording of every rank.

    Works with `-- python train.py ...`, `-- torchrun ... train.py ...` and, for MindSpore
    scripts, `-- msrun ... train.py ...`; the script is not modified. COMMAND runs in its
    own process group; SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to
    stepscope are forwarded to it, except a signal ignored when stepscope started (`nohup
    stepscope run`: SIGHUP stays ignored). The script's own SIGTERM handler, set at any
    time, is honoured, and a SIGTERM to a process it forked (a DataLoader worker) never
    reaches it. When it ends, what it left of its process group is ended; processes it
    detached into a session of their own (start_new_session=True, setsid) are left alone
    when it exited by itself. Exits with the command's exit status (128 + N when
    signal N ended it), or 3 when it succeeded but a MindSpore script had no step
    stepscope could attach to (the message says what it looked for). Then RUN/report.html
    is written, bounded in time; it never changes the exit status.
    """
    from ..launcher.instrument import launch

    env: dict[str, str] = {}
    if max_steps:
        env["STEPSCOPE_MAX_STEPS"] = str(max_steps)
    if tokens_per_step is not None:
        env["STEPSCOPE_TOKENS_PER_STEP"] = repr(tokens_per_step)
    if samples_per_step is not None:
        env["STEPSCOPE_SAMPLES_PER_STEP"] = repr(samples_per_step)
    if cross_rank_every is not None:
        env["STEPSCOPE_CROSS_RANK_EVERY"] = str(cross_rank_every)
    if flops_convention:
        from ..calc.flopsrun import NAMES

        if flops_convention not in NAMES:
            raise click.BadParameter(f"{flops_convention!r}: expected one of "
                                     f"{', '.join(NAMES)}", param_hint="--flops-convention")
        env["STEPSCOPE_FLOPS_CONVENTION"] = flops_convention
    if peak_tflops is not None:
        from ..calc.hardware import PEAK_ENV

        env[PEAK_ENV] = repr(peak_tflops)
    if alerts_file or metrics_port is not None or os.environ.get("STEPSCOPE_ALERTS"):
        from ..alerts.run_hooks import live_env  # start-up time: only when alerts are asked for

        env.update(live_env(alerts_file, metrics_port))
    env.update(_export_env(tensorboard_dir, mlflow_uri, mlflow_experiment))
    outcome = launch(list(command), out, name=name, profile_steps=profile_steps, env=env,
                     grace_s=grace_s)
    if env.get("STEPSCOPE_ALERTS"):  # the launcher outlives a killed trainer: send its rest
        from ..alerts.run_hooks import flush_after_run

        flush_after_run(outcome.run_dir, env["STEPSCOPE_ALERTS"])
    if outcome.profile_dir is not None:  # analysed here: never in the launcher or trainer
        outcome.profile_analysis = _analyze_profile(outcome.run_dir, outcome.profile_dir,
                                                    profile_steps)
    html: Path | None = None
    html_note: str | None = "not asked for (--no-html)"
    if not no_html:  # after the profile's analysis, which the page shows
        from .run_html import write_after_run

        html, html_note = write_after_run(outcome.run_dir)
    if as_json:
        emit_json({**outcome.to_dict(), "html": str(html) if html else None,
                   "html_note": html_note}, one_line=True)
    else:
        line = f"stepscope: run {outcome.status}: {outcome.run_dir}"
        if outcome.error:
            line += f" ({outcome.error})"
        click.echo(line, err=True)
        if outcome.profile_dir is not None:
            click.echo(f"stepscope: profile {outcome.profile_analysis.get('status')}: "
                       f"{outcome.profile_dir}", err=True)
        if html is not None:
            click.echo(f"stepscope: HTML report: {html}", err=True)
        elif not no_html:
            click.echo(f"stepscope: report.html not written: {html_note}", err=True)
    sys.exit(outcome.returncode if outcome.returncode >= 0 else 128 - outcome.returncode)


def _export_env(tensorboard_dir: str | None, mlflow_uri: str | None,
                experiment: str) -> dict[str, str]:
    """The live export's variables for the children; a missing library is an error here,
    before training starts, not a warning inside it."""
    from ..plugs import MLFLOW_ENV, MLFLOW_EXPERIMENT_ENV, TENSORBOARD_ENV
    from ..report.export import require_library

    env: dict[str, str] = {}
    if tensorboard_dir:
        require_library("tensorboard")
        env[TENSORBOARD_ENV] = str(Path(tensorboard_dir).resolve())
    if mlflow_uri:
        require_library("mlflow")
        env[MLFLOW_ENV] = mlflow_uri
        env[MLFLOW_EXPERIMENT_ENV] = experiment
    return env


def _analyze_profile(run_dir: Path, prof_dir: Path, steps: str | None) -> dict[str, Any]:
    """The trace analysis of the captured per-rank traces, written beside the capture
    (``profiles/<stamp>.analysis.json``) and recorded as a ``profile`` event."""
    from ..analysis.trace.breakdown import analyze  # heavy: only when a profile was taken
    from ..rundir.store import RunDir
    from ..traces import read_trace

    run = RunDir(run_dir)
    files = sorted(p.name for p in prof_dir.glob("*.json"))
    out: dict[str, Any] = {"files": files}
    if not files:
        out = {"status": "no traces captured (did the run reach the profiled steps?)"}
    else:
        try:
            out["report"] = analyze(read_trace(prof_dir)).to_dict()
            out["status"] = "analyzed"
        except Exception as exc:  # archived anyway; say why the analysis failed
            out["status"] = f"archived (analysis failed: {type(exc).__name__}: {exc})"
        try:
            out["analysis_file"] = str(run.write_profile_analysis(prof_dir, out))
        except OSError as exc:
            out["write_error"] = str(exc)
    run.append_event({"type": "profile", "dir": str(prof_dir.relative_to(run.path)),
                      "steps": steps, "status": out.get("status"),
                      "analysis_file": out.get("analysis_file")})
    return out
