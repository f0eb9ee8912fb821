"""Failures inside the zero-code hooks: counted, warned about once, never raised.

Every hook body of ``stepscope run`` is guarded; what fails is counted here (run.json
``config.hook_failures``) and training carries on unmeasured where it failed.

Example::

    failures = Failures()
    try:
        ...
    except Exception as exc:
        failures.failed("forward hook", exc)   # one RuntimeWarning, count 1
"""

from __future__ import annotations

import warnings

__all__ = ["Failures"]


class Failures:
    """How many hook bodies failed; the first one is warned about."""

    def __init__(self) -> None:
        self.count = 0

    def failed(self, where: str, exc: BaseException) -> None:
        """Count a failure inside a hook; warn once. Training carries on unmeasured."""
        self.count += 1
        if self.count == 1:
            # stacklevel 3: the warning names the hook's caller, the training code
            warnings.warn(f"stepscope: {where} failed ({type(exc).__name__}: {exc}); "
                          "training continues, this measurement may be incomplete",
                          RuntimeWarning, stacklevel=3)
