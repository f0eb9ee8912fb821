"""stepscope: training-performance evaluation and bottleneck location.

The public surface is listed in ``__all__`` and pinned by a test. Example::

    import stepscope
    with stepscope.Recorder("runs/exp1") as rec:
        for batch in rec.wrap_loader(loader):
            with rec.step(tokens=batch.numel(), samples=len(batch)) as s:
                ...
    run = stepscope.open_run("runs/exp1")          # the read side's one door
    run.sheet().tokens_per_s                       # the health-check sheet
    run.findings()                                 # ranked findings
    run.compare(stepscope.open_run("runs/exp2")).verdict
    tables = stepscope.read_trace("runs/exp1/profiles")          # profiler traces -> events

Every name but the errors is imported on first use, so ``import stepscope`` (done by the
zero-code bootstrap in every training process, and by every CLI start) imports nothing
heavy: not even numpy until a recorder or a table is asked for.
"""

from __future__ import annotations

import sys
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ModuleSpec
from importlib.util import spec_from_loader
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .errors import (
    ConfigError,
    RunDirError,
    StepscopeError,
    TraceFormatError,
    UnknownDeviceError,
)
from .version import __version__

__all__ = [
    "__version__",
    "Recorder",
    "Step",
    "RunDir",
    "Run",
    "open_run",
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
    "Recorder": ("stepscope.record.recorder", "Recorder"),
    "Step": ("stepscope.record.recorder", "Step"),
    "RunDir": ("stepscope.rundir.store", "RunDir"),
    "Run": ("stepscope.rundir.run", "Run"),
    "open_run": ("stepscope.rundir.run", "open_run"),
    "RunMeta": ("stepscope.schema", "RunMeta"),
    "StepTable": ("stepscope.schema", "StepTable"),
    "EventTable": ("stepscope.schema", "EventTable"),
    "Finding": ("stepscope.findings", "Finding"),
    "summarize": ("stepscope.analysis.summary", "summarize"),
    "diagnose": ("stepscope.analysis.diagnose", "diagnose"),
    "compare_runs": ("stepscope.analysis.compare", "compare_runs"),
    "read_trace": ("stepscope.traces", "read_trace"),
    "analyze_trace": ("stepscope.analysis.trace.breakdown", "analyze"),
}

if TYPE_CHECKING:
    from .analysis.compare.runs import compare_runs
    from .analysis.diagnose import diagnose
    from .analysis.summary import summarize
    from .analysis.trace.breakdown import analyze as analyze_trace
    from .findings import Finding
    from .record.recorder import Recorder, Step
    from .rundir.run import Run, open_run
    from .rundir.store import RunDir
    from .schema import EventTable, RunMeta, StepTable
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


# Import paths of modules that moved, kept working for users' code (``import
# stepscope.store``, ``from stepscope.recorder import Recorder``): the old name is the same
# module object as the new one, loaded on first import of either.
_MOVED = {
    "stepscope.store": "stepscope.rundir.store",
    "stepscope.index": "stepscope.rundir.index",
    "stepscope.rundir.write": "stepscope.rundir.store",
    "stepscope.recorder": "stepscope.record.recorder",
    "stepscope.session": "stepscope.record.session",
    "stepscope.conditions": "stepscope.record.conditions",
    "stepscope.crossrank": "stepscope.record.crossrank",
    "stepscope.losscheck": "stepscope.record.losscheck",
    "stepscope.rank": "stepscope.record.rank",
    "stepscope.sigterm": "stepscope.record.signals",
    "stepscope.envinfo": "stepscope.record.host",
    "stepscope.isolate": "stepscope.record.isolate",
    "stepscope.launch": "stepscope.launcher.instrument",
    "stepscope.supervise": "stepscope.launcher.supervise",
    "stepscope.engine": "stepscope.proc.engine",
    "stepscope.record.plug_env": "stepscope.plugs",  # the env-var names, merged into the board
    "stepscope.analysis.findings": "stepscope.findings",
    "stepscope.analysis.environment": "stepscope.analysis.env_evidence",
    "stepscope.analysis.compare.scaling": "stepscope.analysis.compare.scaling_efficiency",
    "stepscope.analysis.segment": "stepscope.analysis.regimes",
    "stepscope.analysis.flopsconv": "stepscope.analysis.mfu",
    "stepscope.integrations.torch.values": "stepscope.integrations.torch.readers",
    "stepscope.integrations.torch.meta": "stepscope.integrations.torch.fingerprint",
    "stepscope.integrations.torch.flopsrun": "stepscope.calc.flopsrun",
    "stepscope.integrations.mindspore.scaling": "stepscope.integrations.mindspore.loss_scale",
    "stepscope.integrations.mindspore.loop": "stepscope.integrations.mindspore.callback",
}


class _MovedFinder(MetaPathFinder, Loader):
    """Finds a moved module under its old name and hands back the module itself."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None
                  ) -> ModuleSpec | None:
        return spec_from_loader(fullname, self) if fullname in _MOVED else None

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        import importlib

        return importlib.import_module(_MOVED[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        pass  # the new module ran when it was imported


if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedFinder())
