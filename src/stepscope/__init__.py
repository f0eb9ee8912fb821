"""stepscope: training-performance evaluation and bottleneck location.

The public surface is listed in ``__all__`` and pinned by a test. Example::

    import stepscope
    with stepscope.Recorder("runs/exp1") as rec:
        for batch in rec.wrap_loader(loader):
            with rec.step(tokens=batch.numel(), samples=len(batch)) as s:
                ...
"""

from __future__ import annotations

__version__ = "0.1.0"

from .errors import (  # noqa: E402
    ConfigError,
    RunDirError,
    StepscopeError,
    TraceFormatError,
    UnknownDeviceError,
)
from .recorder import Recorder, Step  # noqa: E402
from .schema import EventTable, RunMeta, StepTable  # noqa: E402
from .store import RunDir  # noqa: E402

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
]
