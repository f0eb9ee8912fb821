"""A post-import hook: run a function right after the script's own ``import NAME``.

``stepscope run``'s ``sitecustomize`` must not import torch or MindSpore itself (it would
slow every process of a job and import them where the script never does), so the
zero-code paths wait: :class:`AfterImport` sits first on ``sys.meta_path``, lets the normal
finders locate ``NAME``, wraps the loader's ``exec_module`` and, once the module has run,
removes itself and calls ``then()``. ``then`` must not raise (the user's import would).

Example::

    sys.meta_path.insert(0, AfterImport("torch", lambda: install(settings)))
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable, Sequence

__all__ = ["AfterImport"]


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then()`` right after ``import name`` finishes, once."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name, self.then = name, then
        self._busy = False

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy = False
        if spec is None or spec.loader is None:
            return None
        loader, me = spec.loader, self
        orig_exec = loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            orig_exec(module)
            sys.meta_path[:] = [f for f in sys.meta_path if f is not me]
            me.then()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
