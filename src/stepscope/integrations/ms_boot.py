"""Zero-code MindSpore: wait for the script's ``import mindspore``, then instrument it.

The ``sitecustomize`` of ``stepscope run`` calls :func:`bootstrap` in every Python process
of the job (as it calls the torch one). Importing MindSpore here would slow every process
and import it where the script never does, so a post-import hook waits until the script
imports it and then calls :func:`stepscope.integrations.mindspore.auto.install`. This
module imports nothing of MindSpore.

Example::

    from stepscope.integrations import ms_boot
    ms_boot.bootstrap()        # no-op unless STEPSCOPE_RUN_DIR is set
"""

from __future__ import annotations

import os
import sys

from ._afterimport import AfterImport
from .torch.settings import Settings

__all__ = ["bootstrap"]


def _install(settings: Settings) -> None:
    try:
        from .mindspore import auto

        auto.install(settings)
    except Exception as exc:  # never break the user's import
        sys.stderr.write(f"stepscope: MindSpore instrumentation not installed: "
                         f"{type(exc).__name__}: {exc}\n")


def bootstrap() -> None:
    """Entry point of the ``sitecustomize`` that ``stepscope run`` puts on PYTHONPATH."""
    settings = Settings.from_env()
    # msrun's scheduler process runs the script too (MS_ROLE=MS_SCHED): it trains nothing
    # when the script calls init(), and is no rank of the job when it does not.
    if settings is None or os.environ.get("MS_ROLE") == "MS_SCHED":
        return
    if "mindspore" in sys.modules:
        _install(settings)
        return
    sys.meta_path.insert(0, AfterImport("mindspore", lambda: _install(settings)))
