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

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Sequence

from .torch.settings import Settings

__all__ = ["bootstrap"]


def _install(settings: Settings) -> None:
    try:
        from .mindspore import auto

        auto.install(settings)
    except Exception as exc:  # never break the user's import
        sys.stderr.write(f"stepscope: MindSpore instrumentation not installed: "
                         f"{type(exc).__name__}: {exc}\n")


class _MindSporeImportHook(importlib.abc.MetaPathFinder):
    """Runs :func:`_install` right after ``import mindspore`` finishes."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._busy = False

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "mindspore" or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy = False
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        orig_exec = loader.exec_module
        settings = self.settings

        def exec_module(module: types.ModuleType) -> None:
            orig_exec(module)
            sys.meta_path[:] = [f for f in sys.meta_path
                                if not isinstance(f, _MindSporeImportHook)]
            _install(settings)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


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
    sys.meta_path.insert(0, _MindSporeImportHook(settings))
