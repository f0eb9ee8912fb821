"""The read side's one door: a run directory opened, and everything a reader asks of it.

``stepscope report``, ``diagnose``, ``compare``, ``index``, ``export``, the dashboard (every
page and ``/api/*`` document), the live alerts' baseline and users' own code all read runs
through :class:`Run`, so they give the same numbers and verdicts by construction: one
sheet (the health rules' regimes over the recorded conditions, the profile's split), one
diagnosis (the newest archived profile's breakdown included), one comparison (conditions,
seed, repeats), one "has this run changed" key (:attr:`Run.key`, the results store's).

What a ``Run`` computes is kept in the run's results store (``rundir.results``) under that
key, so a warm command is a file read; a run whose files change gets a new key.

Example::

    run = stepscope.open_run("runs/exp1")
    run.sheet().tokens_per_s                       # the health-check sheet
    [f.message for f in run.findings()]            # ranked findings
    run.diagnosis().bottleneck
    run.series(points=2000)["series"]["result/loss"]
    run.compare(stepscope.open_run("runs/exp2")).verdict
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from ..analysis.compare.runs import Comparison, compare_runs, diff_fingerprints
from ..analysis.compare.speed import kept_run_speeds, prepare_speed
from ..analysis.diagnose import Diagnosis, diagnose, health_findings, records_lost
from ..analysis.mfu import with_flops_convention
from ..analysis.profile_split import wants_profile, with_profile_split
from ..analysis.series import series_doc
from ..analysis.summary import Conditions, Sheet, summarize
from ..errors import ConfigError, StepscopeError
from ..findings import Finding, severity_rank
from ..proc import forked
from ..schema import RunMeta, StepTable
from .results import Stored, run_state
from .steps_table import StepRead
from .store import STEPS_DIR, ReadStats, RunDir

__all__ = ["Run", "open_run", "no_records_error", "latest_profile", "REPORT_POINTS"]

# Points per chart series embedded in report.html (min/max envelopes past it): a chart is
# ~500-1,400 px wide, so 4,000 keeps every pixel's extremes and the file a few MB at most.
REPORT_POINTS = 4000
_UNSET: Any = object()


def open_run(path: str | os.PathLike[str], *, flops_convention: str | None = None) -> Run:
    """The run directory at ``path``, opened for reading (raises ``RunDirError`` when it is
    not one); ``flops_convention``: MFU under that convention, as the run recorded it."""
    return Run.open(path, flops_convention=flops_convention)


class Run:
    """A run directory opened for reading (see the module docstring).

    Reads are lazy and done once: run.json at open, the step table, events and condition
    samples when first asked for. ``key`` is the state of the run's files when it was
    opened; :meth:`changed` says whether they moved on since (reopen to see the new state).
    """

    def __init__(self, rd: RunDir, *, flops_convention: str | None = None,
                 fork: bool = False, key: str | None = None) -> None:
        self.dir = rd
        self.path = rd.path
        # key: the caller's run_state of this run, just taken (the index's scan)
        self.key: str | None = key if key is not None else run_state(rd.path)
        self.flops_convention = flops_convention
        self._fork = fork
        meta = rd.read_meta()
        self.meta: RunMeta = (with_flops_convention(meta, flops_convention)
                              if flops_convention else meta)
        self._read: StepRead | None = None
        self._table: StepTable | None = None
        self._stats: ReadStats | None = None
        self._events: list[dict[str, Any]] | None = None
        self.event_stats: ReadStats | None = None
        self._conditions: Conditions | None = _UNSET
        self._sheet: Sheet | None = None
        self._profile: dict[str, Any] | None = _UNSET
        self._diagnosis: Diagnosis | None = None
        self._health: list[Finding] | None = None
        self.diagnosis_note: str | None = None
        self._series: dict[tuple[Any, ...], dict[str, Any]] = {}

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, flops_convention: str | None = None,
             fork: bool = False) -> Run:
        """Open ``path`` (raises ``RunDirError`` when it is not a run directory).

        ``fork`` (stepscope's own one-shot commands: ``report``, ``export``): when the sheet
        and the findings are both computed, the health rules run in a forked child while
        this process summarizes, for tables of the size where that pays
        (``proc.forked.worth_it``)."""
        return cls(RunDir.open(path), flops_convention=flops_convention, fork=fork)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"

    # -- the files -------------------------------------------------------------------
    @property
    def meta_problems(self) -> list[str]:
        return self.dir.meta_problems

    def changed(self) -> bool:
        """Whether the run's files differ from when it was opened."""
        return run_state(self.path) != self.key

    def stored(self, name: str, params: Any, others: Sequence[Run] = ()) -> Stored:
        """The results-store entry ``name`` (with ``params``) of this state of the run (and
        of ``others``, for a result of several runs): the one cache key of every reader."""
        runs = [self, *others]
        return Stored([r.path for r in runs], name, params, states=[r.key for r in runs])

    def events(self, type: str | None = None) -> list[dict[str, Any]]:
        """events.jsonl's records (of ``type``); unreadable ones counted in
        ``event_stats``."""
        if self._events is None:
            self._events, self.event_stats = self.dir.read_events()
        if type is None:
            return self._events
        return [e for e in self._events if e.get("type") == type]

    @property
    def conditions(self) -> Conditions:
        """The host and device condition samples per rank (``conditions/``)."""
        if self._conditions is _UNSET:
            self._conditions = self.dir.read_conditions()
        assert self._conditions is not None
        return self._conditions

    def start_read(self) -> Run:
        """Start decoding the step files in worker processes (the caller goes on; the
        table is waited for when first used). Returns the run."""
        if self._table is None and self._read is None:
            self._read = self.dir.start_read_steps()
        return self

    def close(self) -> None:
        """End a started read's workers (the table, if read, stays)."""
        if self._read is not None:
            self._read.close()
            self._read = None

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, *, require: bool = True) -> tuple[StepTable, ReadStats]:
        """(step table, read counts); ``require``: raise the one-line error of a run
        without readable step records."""
        if self._table is None:
            self.start_read()
            assert self._read is not None
            try:
                self._table, self._stats = self._read.result()
            finally:
                self.close()
        assert self._stats is not None
        if require and not len(self._table):
            raise no_records_error(self.dir, self._stats)
        return self._table, self._stats

    @property
    def table(self) -> StepTable:
        return self.read(require=False)[0]

    @property
    def loaded_table(self) -> StepTable | None:
        """The step table if it was read already (nothing is read here)."""
        return self._table

    @property
    def stats(self) -> ReadStats:
        """Read counts: of the read, or of the one the stored sheet was made from."""
        if self._stats is None:
            self.read(require=False)
        assert self._stats is not None
        return self._stats

    def profile(self, *, analyse: bool = False) -> dict[str, Any] | None:
        """The newest archived profile's analysis (written beside it by ``stepscope
        run``); ``analyse``: a capture without one (MindSpore's, never analysed in the
        training process) is read and analysed now. None without a profile."""
        if self._profile is _UNSET:
            self._profile = latest_profile(self.dir)
        doc = self._profile
        if analyse and doc is not None and not isinstance(doc.get("report"), dict) \
                and doc.get("status") == "not analysed":
            from ..analysis.trace.breakdown import analyze  # heavy: only when needed
            from ..traces import read_trace

            doc = dict(doc)
            try:
                doc["report"] = analyze(read_trace(self.dir.profile_dirs()[-1])).to_dict()
                doc["status"] = "analysed when the report was made"
            except (StepscopeError, OSError, ValueError) as exc:
                doc["status"] = f"not analysed ({type(exc).__name__}: {exc})"
            self._profile = doc
        return doc

    # -- what readers ask ------------------------------------------------------------
    def sheet(self) -> Sheet:
        """The health-check sheet (``analysis.summary.summarize`` over the recorded
        conditions, with the archived profile's step split)."""
        if self._sheet is None:
            self._analyse(findings=False)
        assert self._sheet is not None
        return self._sheet

    def known_sheet(self) -> Sheet | None:
        """The sheet when it is computed already (here, or in the results store for this
        state of the run), else None: nothing is read or computed."""
        if self._sheet is None:
            doc = self.stored("sheet", {"flops_convention": self.flops_convention}).get()
            if doc is not None:
                self._take_stored_sheet(doc)
        return self._sheet

    def analyse(self, *, series_points: int | None = None) -> None:
        """Compute the sheet and the diagnosis now, in the order that uses both CPUs
        (``fork``: the health rules in a child while this process summarizes; the chart
        document of ``series_points`` points, if asked for, made meanwhile)."""
        self._analyse(findings=True, series_points=series_points)
        self.diagnosis()

    def diagnosis(self, trace_report: Mapping[str, Any] | None = None) -> Diagnosis:
        """Ranked findings, the bottleneck and advice (``analysis.diagnose``), with the
        newest archived profile's breakdown; a running run's silence is measured against
        the clock now. ``trace_report``: another trace's breakdown instead of the archived
        profile's (``diagnose --trace``; neither kept nor stored: not the run's own)."""
        if trace_report is not None:
            return self._diagnose(self.meta.status == "running", trace_report)
        if self._diagnosis is None:
            running = self.meta.status == "running"
            entry = None if running else self.stored(
                "diagnosis", {"flops_convention": self.flops_convention})
            doc = entry.get() if entry is not None else None
            if doc is not None:
                self._diagnosis = Diagnosis.from_stored(doc["diagnosis"])
                self.diagnosis_note = doc["note"]
                if self._stats is None:
                    self._stats = ReadStats.from_dict(doc["stats"])
            else:
                self._diagnosis = self._diagnose(running)
                if entry is not None:
                    entry.put({"diagnosis": self._diagnosis.to_stored(),
                               "stats": self.stats.to_dict(), "note": self.diagnosis_note})
        return self._diagnosis

    def findings(self) -> list[Finding]:
        """The diagnosis's findings, most severe first."""
        return sorted(self.diagnosis().findings, key=lambda f: severity_rank(f.severity))

    def series(self, points: int = 2000, heat_cols: int = 600,
               steps: tuple[int, int | None] | None = None) -> dict[str, Any]:
        """The chart document: per-step series (min/max envelopes past ``points``), x
        axes, phases, the rank heatmap and fleet bands; ``steps`` = (first, last)
        narrows it to a window (last None: up to the newest step)."""
        at = (points, heat_cols, steps)
        if at not in self._series:
            table, _ = self.read()
            self._series[at] = series_doc(self.path.name, table, self.sheet(), self.meta,
                                          points, heat_cols, steps)
        return self._series[at]

    def compare(self, other: Run, *, seed: int = 0, repeats: Sequence[Run] = ()
                ) -> Comparison:
        """Run ``other`` against this run as the baseline: one variable, two ledgers, one
        verdict (``analysis.compare``), with both runs' conditions; ``repeats``: other
        runs of this configuration, for the run-to-run noise."""
        entry = self._compare_entry(other, seed, repeats)
        doc = entry.get()
        if isinstance(doc, dict) and doc.get("whole") is True:
            try:
                return Comparison.from_store(doc)
            except (KeyError, TypeError, ValueError, IndexError):
                pass  # an entry of another shape: computed again
        result = self._compare(other, seed, repeats)
        entry.put(_stored_comparison(result))
        return result

    def compare_doc(self, other: Run, *, seed: int = 0, repeats: Sequence[Run] = ()
                    ) -> dict[str, Any]:
        """``compare --json``'s document (the stored one when the runs are unchanged)."""
        entry = self._compare_entry(other, seed, repeats)
        doc = entry.get()
        if isinstance(doc, dict) and isinstance(doc.get("comparison"), dict):
            stored: dict[str, Any] = doc["comparison"]
            return stored
        result = self._compare(other, seed, repeats)
        entry.put(_stored_comparison(result))
        return result.to_dict()

    def sheet_doc(self) -> dict[str, Any]:
        """``report --json``'s document: the sheet, the run's identity, findings, and what
        the reader skipped or lost."""
        d = self.sheet().to_dict()
        meta = self.meta
        d["run"] = {"path": str(self.path), "run_id": meta.run_id, "name": meta.name,
                    "status": meta.status, "error": meta.error}
        d["findings"] = [f.to_dict() for f in self.findings()]
        d["read_problems"] = self.stats.problems
        d["read"] = {**self.stats.to_dict(), "meta_problems": self.meta_problems}
        d["records_lost"], d["write_error"] = records_lost(meta, self.events())
        return d

    # -- the work behind them --------------------------------------------------------
    def _take_stored_sheet(self, doc: dict[str, Any]) -> None:
        self._sheet = Sheet.from_dict(doc["sheet"])
        self._profile = doc["profile"]
        if self._stats is None:
            self._stats = ReadStats.from_dict(doc["stats"])

    def _analyse(self, findings: bool, series_points: int | None = None) -> None:
        """The sheet (from the store while the files are unchanged); with ``findings`` and
        ``fork``, the health rules in a forked child meanwhile (a cold report of a
        1,024-rank run spent ~1.5 s on the two one after the other)."""
        if self._sheet is not None:
            return
        entry = self.stored("sheet", {"flops_convention": self.flops_convention})
        doc = entry.get()
        if doc is not None:
            self._take_stored_sheet(doc)
            return
        table, stats = self.read()
        wanted = findings and self._fork and self._diagnosis is None \
            and self.meta.status != "running" \
            and self.stored("diagnosis", {"flops_convention": self.flops_convention}
                            ).get() is None
        with forked.Forked(health_findings, table, self.meta, self.events(),
                           fork=wanted and forked.worth_it(len(table))) as job:
            sheet = summarize(table, self.meta, skipped_records=stats.skipped,
                              conditions=self.conditions)
            # Reading an unanalysed capture costs a trace read: only when the split needs it.
            profile = self.profile(analyse=wants_profile(sheet))
            self._sheet = with_profile_split(sheet, profile)
            if series_points is not None:
                self.series(series_points)
            if wanted and job.forked:
                self._health = job.result()
        entry.put({"stats": stats.to_dict(), "sheet": self._sheet.to_dict(),
                   "profile": profile})

    def _diagnose(self, running: bool, report: Mapping[str, Any] | None = None
                  ) -> Diagnosis:
        table, stats = self.read(require=False)
        # A live run that has not stepped yet is diagnosed (a stall at start-up); a
        # finished one, or one whose records are all unreadable, has nothing to diagnose.
        if not len(table) and (not running or stats.skipped):
            raise no_records_error(self.dir, stats)
        if report is None:
            profile = self.profile(analyse=True)
            report = profile.get("report") if profile else None
            if profile is not None and not isinstance(report, dict):
                self.diagnosis_note = (f"stepscope: note: archived profile skipped: "
                                       f"{profile.get('status')}")
        # The door is an edge that reads the clock: a running run's silence is a stall.
        now = time.time() if running else None
        health = self._health if not running else None
        return diagnose(table, self.meta, events=self.events(),
                        trace_report=report if isinstance(report, dict) else None,
                        now_wall_s=now, conditions=self.conditions, health=health)

    def _compare_entry(self, other: Run, seed: int, repeats: Sequence[Run]) -> Stored:
        who = [str(r.path.resolve()) for r in (other, *repeats)]
        return self.stored("compare", {"runs": who, "seed": seed}, [other, *repeats])

    def _compare(self, other: Run, seed: int, repeats: Sequence[Run]) -> Comparison:
        with kept_run_speeds():
            # This run's share of the speed ledger is computed while the other's files
            # decode in worker processes (about a second of the ~9 s a cold compare of two
            # 1,024-rank runs took). Not past forked.MAX_ROWS: at 9.6 M rows it gained
            # nothing and took the processes' memory together from 1.4 GB to 2.0 GB.
            ta, _ = self.read()
            with other.start_read():
                if forked.worth_it(len(ta)):
                    prepare_speed(ta, self.meta, self.conditions, seed=seed)
                tb, _ = other.read()
            reps = []
            for r in repeats:
                differ = diff_fingerprints(self.meta, r.meta)[0]
                if differ:
                    raise ConfigError(f"{r.path} is not a repeat of {self.path}: "
                                      f"{', '.join(str(d) for d in differ)}")
                reps.append((r.read()[0], r.meta))
            return compare_runs(ta, self.meta, tb, other.meta, self.events("eval"),
                                other.events("eval"), seed=seed, baseline_repeats=reps,
                                conditions=(self.conditions, other.conditions))


def _stored_comparison(result: Comparison) -> dict[str, Any]:
    """What the store keeps: the comparison, and whether it comes back whole from JSON
    (then the views may be drawn from it; a NaN comes back as null, and is not)."""
    doc = result.to_store()
    try:
        whole = Comparison.from_store(orjson.loads(orjson.dumps(doc))) == result
    except (KeyError, TypeError, ValueError, IndexError, orjson.JSONEncodeError):
        whole = False
    return {**doc, "whole": whole}


def no_records_error(run: RunDir, stats: ReadStats) -> StepscopeError:
    """Why a run has no readable step records, as the one-line error the CLI prints."""
    steps = run.path / STEPS_DIR
    try:
        os.listdir(steps)
    except FileNotFoundError:
        return StepscopeError(f"{run.path} has no {STEPS_DIR}/ directory: no step was "
                              "recorded; record steps with stepscope.Recorder or run the "
                              "training script under `stepscope run`")
    except OSError as exc:
        return StepscopeError(f"cannot read {steps}: {exc.strerror}; give this user read "
                              "access to the run directory")
    if stats.skipped:
        return StepscopeError(f"{run.path} has no readable step records: {stats.skipped} "
                              f"unreadable record(s) in {stats.files} file(s), first: "
                              f"{stats.problems[0] if stats.problems else '?'}")
    # the instrumentation's own account of why, when it left one in events.jsonl
    why = [str(e["message"]) for e in run.read_events(type="finding")[0]
           if str(e.get("message", "")).startswith("no steps recorded")]
    return StepscopeError(
        f"{run.path} has no step records ({stats.files} step file(s)); " + (why[0] if why
        else "record steps with stepscope.Recorder or run the training script under "
        "`stepscope run` (it must call optimizer.step())"))


def latest_profile(run: RunDir) -> dict[str, Any] | None:
    """The newest archived profile's analysis (written beside it by `stepscope run`)."""
    dirs = run.profile_dirs()
    for d in reversed(dirs):
        f = d.with_name(d.name + ".analysis.json")
        try:
            doc: dict[str, Any] = orjson.loads(f.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        doc["profile_dir"] = d.name
        return doc
    return {"profile_dir": dirs[-1].name, "status": "not analysed"} if dirs else None
