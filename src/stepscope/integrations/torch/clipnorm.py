"""The pre-clip gradient norm, wherever a training loop clips.

Two ways to clip reach torch:

* ``torch.nn.utils.clip_grad_norm_(params, max_norm)``: its return value is the norm
  before clipping (plain loops, Lightning, accelerate before 1.16);
* ``torch.nn.utils.clip_grads_with_norm_(params, max_norm, total_norm)`` after the caller
  computed ``total_norm`` itself (``get_total_norm``): accelerate 1.16's
  ``Accelerator.clip_grad_norm_``, and so transformers' Trainer, clips this way, one norm
  over every device mesh. ``total_norm`` is the pre-clip norm.

:func:`watch_clip_norms` wraps both where torch keeps them (never a user object) and hands
each norm to a callback. torch's own ``clip_grad_norm_`` calls its private
``_clip_grads_with_norm_``, not the public name, so one clip is seen once.

Example::

    undo = watch_clip_norms(lambda norm: print(float(norm)))
    ...   # training
    undo()
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

__all__ = ["ClipNorm", "watch_clip_norms"]


class ClipNorm:
    """The pre-clip norm seen in the open step (a device tensor, read at emission)."""

    def __init__(self) -> None:
        self.value: Any = None

    def seen(self, norm: Any) -> None:
        self.value = norm.detach() if hasattr(norm, "detach") else norm

    def given(self, norm: Any) -> None:
        """A norm a framework computed itself (DeepSpeed ZeRO's), kept as given."""
        self.value = norm

    def clear(self) -> None:
        self.value = None


def watch_clip_norms(on_norm: Callable[[Any], None]) -> Callable[[], None]:
    """Call ``on_norm(norm)`` with each pre-clip norm; returns the function that puts the
    originals back (where they are still ours). ``on_norm`` must not raise."""
    import torch

    utils = torch.nn.utils
    orig_clip = utils.clip_grad_norm_
    orig_with: Any = getattr(utils, "clip_grads_with_norm_", None)  # torch >= 2.6

    @functools.wraps(orig_clip)
    def clip_grad_norm_(*args: Any, **kwargs: Any) -> Any:
        norm = orig_clip(*args, **kwargs)
        on_norm(norm)
        return norm

    utils.clip_grad_norm_ = clip_grad_norm_
    utils.clip_grad.clip_grad_norm_ = clip_grad_norm_
    wrapped_with: Any = None
    if orig_with is not None:
        @functools.wraps(orig_with)
        def clip_grads_with_norm_(*args: Any, **kwargs: Any) -> Any:
            total = kwargs.get("total_norm", args[2] if len(args) > 2 else None)
            out = orig_with(*args, **kwargs)
            if total is not None:
                on_norm(total)
            return out

        wrapped_with = clip_grads_with_norm_
        utils.clip_grads_with_norm_ = clip_grads_with_norm_

    def undo() -> None:
        if utils.clip_grad_norm_ is clip_grad_norm_:
            utils.clip_grad_norm_ = orig_clip
        if utils.clip_grad.clip_grad_norm_ is clip_grad_norm_:
            utils.clip_grad.clip_grad_norm_ = orig_clip
        if wrapped_with is not None and utils.clip_grads_with_norm_ is wrapped_with:
            utils.clip_grads_with_norm_ = orig_with

    return undo
