"""stepscope: training-performance evaluation and bottleneck location.

The public surface is listed in ``__all__`` and pinned by a test. Example::

    import stepscope
    with stepscope.Recorder("runs/exp1") as rec:
        for batch in rec.wrap_loader(loader):
            with rec.step(tokens=batch.numel(), samples=len(batch)) as s:
                ...
    run = stepscope.RunDir.open("runs/exp1")
    table, _ = run.read_steps()
    sheet = stepscope.summarize(table, run.read_meta())          # the health-check sheet
    result = stepscope.diagnose(table, run.read_meta())          # ranked findings
    tables = stepscope.read_trace("runs/exp1/profiles")          # profiler traces -> events

Every name but the errors is imported on first use, so ``import stepscope`` (done by the
zero-code bootstrap in every training process, and by every CLI start) imports nothing
heavy: not even numpy until a recorder or a table is asked for.
"""

from __future__ import annotations

__version__ = "0.1.0"

from typing import TYPE_CHECKING, Any  # noqa: E402

from .errors import (  # noqa: E402
    ConfigError,
    RunDirError,
    StepscopeError,
    TraceFormatError,
    UnknownDeviceError,
)

__all__ = [
    "__version__",
    "Recorder",
    "Step",
    "RunDir",
    "RunMeta",
    "StepTable",
    "EventTable",
    "StepscopeError",
    "RunDirError",
    "TraceFormatError",
    "UnknownDeviceError",
    "ConfigError",
    "Finding",
    "summarize",
    "diagnose",
    "compare_runs",
    "read_trace",
    "analyze_trace",
]

# name -> (module, attribute): imported on first access (PEP 562). Even the recorder and
# the tables (numpy) wait for first use: `stepscope --help` and every other CLI start
# import this package first, and the CLI's start-up is measured (benchmarks/cli_start.py).
_LAZY = {
    "Recorder": ("stepscope.recorder", "Recorder"),
    "Step": ("stepscope.recorder", "Step"),
    "RunDir": ("stepscope.store", "RunDir"),
    "RunMeta": ("stepscope.schema", "RunMeta"),
    "StepTable": ("stepscope.schema", "StepTable"),
    "EventTable": ("stepscope.schema", "EventTable"),
    "Finding": ("stepscope.analysis.findings", "Finding"),
    "summarize": ("stepscope.analysis.summary", "summarize"),
    "diagnose": ("stepscope.analysis.diagnose", "diagnose"),
    "compare_runs": ("stepscope.analysis.compare", "compare_runs"),
    "read_trace": ("stepscope.traces", "read_trace"),
    "analyze_trace": ("stepscope.analysis.trace.breakdown", "analyze"),
}

if TYPE_CHECKING:
    from .analysis.compare.runs import compare_runs
    from .analysis.diagnose import diagnose
    from .analysis.findings import Finding
    from .analysis.summary import summarize
    from .analysis.trace.breakdown import analyze as analyze_trace
    from .recorder import Recorder, Step
    from .schema import EventTable, RunMeta, StepTable
    from .store import RunDir
    from .traces import read_trace


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'stepscope' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
