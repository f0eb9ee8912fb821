"""Phase marks for MindSpore profiles: network and optimizer hooks while a capture runs.

PyNative op names carry no ``Gradients/`` or ``optimizer-`` scope, and the CPU profiler
records no ``RecordFunction`` ranges, so a PyNative trace cannot be split into phases by
name. During a capture (and only then) :class:`PhaseMarks` hooks the network (forward
pre/post, backward pre/post) and the optimizer (forward pre/post) and notes, after a device
sync, the epoch time of each hook: PyNative dispatches asynchronously (the network's forward
hook fires ~30x before its ops finish on a 2-core CPU), and the sync makes each mark the
moment the ops before it have run. The profiled steps are excluded from throughput anyway.

The marks become windows (``windows_from_events``)::

    forward    network forward begins -> network forward ends
    loss       network forward ends -> network backward begins: the loss function, then
               its gradient (the trace reader splits it at the gradient seed op)
    backward   network backward begins -> network backward ends (without backward hooks:
               forward end -> optimizer begins)
    optimizer  optimizer begins -> optimizer ends

Given a ``TrainOneStepCell`` (``Model.train``'s train network), the hooks go on its
``network`` (the network with its loss: then there is no loss window, the network's backward
begins with the loss gradient) and its ``optimizer``.

and the trace reader gives each op the phase of the window its start falls in
(``traces/mindspore_phases.py``). In GRAPH mode and inside ``@jit`` the hooks do not run per
op; nothing is attached there and the op-name scopes are used.

Example::

    marks = PhaseMarks()
    marks.attach(network, optimizer)      # at the capture's start
    ...                                   # one step
    windows = marks.take(step=5, rank=0)  # [{"name": "forward", "start_us": ...}, ...]
    marks.detach()
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["PhaseMarks", "windows_from_events", "MARK_NAMES"]

MARK_NAMES = ("forward_begin", "forward_end", "backward_begin", "backward_end",
              "optimizer_begin", "optimizer_end")


def _sync() -> None:
    """Wait for every dispatched op (MindSpore's own Model and profiler call this)."""
    from mindspore.graph.api import _pynative_executor

    _pynative_executor.sync()


def windows_from_events(events: Sequence[tuple[str, float]]) -> list[tuple[str, float, float]]:
    """(phase, start_us, end_us) windows from one step's hook marks, in time order.

    Example::

        windows_from_events([("forward_begin", 0), ("forward_end", 4), ("backward_begin", 5),
                             ("backward_end", 12), ("optimizer_begin", 12),
                             ("optimizer_end", 14)])
        # [("forward", 0, 4), ("loss", 4, 5), ("backward", 5, 12), ("optimizer", 12, 14)]
    """
    out: list[tuple[str, float, float]] = []
    fwd0 = fwd1 = bwd0 = opt0 = None
    for name, t in events:
        if name == "forward_begin" and fwd0 is None:
            fwd0, fwd1 = t, None
        elif name == "forward_end" and fwd0 is not None:
            fwd1 = t
        elif name == "backward_begin" and bwd0 is None:
            if fwd0 is not None:
                end = t if fwd1 is None else fwd1
                out.append(("forward", fwd0, end))
                if end < t:
                    out.append(("loss", end, t))
            fwd0, fwd1, bwd0 = None, None, t
        elif name == "backward_end" and bwd0 is not None:
            out.append(("backward", bwd0, t))
            bwd0 = None
        elif name == "optimizer_begin":
            if fwd0 is not None and fwd1 is not None:  # no backward hooks fired
                out += [("forward", fwd0, fwd1), ("backward", fwd1, t)]
            fwd0 = fwd1 = None
            opt0 = t
        elif name == "optimizer_end" and opt0 is not None:
            out.append(("optimizer", opt0, t))
            opt0 = None
    if fwd0 is not None and fwd1 is not None:  # a forward with no update (evaluation)
        out.append(("forward", fwd0, fwd1))
    return out


class PhaseMarks:
    """Hooks that note phase boundaries on a PyNative network and optimizer (see module)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.events: list[tuple[str, float]] = []
        self._handles: list[Any] = []
        self.note = ""

    def _hook(self, name: str) -> Callable[..., None]:
        def mark(*_: Any) -> None:  # returns None: gradients pass unchanged
            try:
                _sync()
            except Exception:  # an older MindSpore: the mark is the dispatch time
                pass
            self.events.append((name, self.clock() * 1e6))
        return mark

    def attach(self, network: Any, optimizer: Any) -> bool:
        """Hook ``network`` and ``optimizer`` (either may be None); True when any hook is on.

        Only in PyNative mode, where hooks run per call; a hook that cannot be registered
        is left out and ``note`` says so."""
        import mindspore as ms

        if network is not None and optimizer is None and hasattr(network, "optimizer"):
            network, optimizer = getattr(network, "network", None), network.optimizer
        if ms.get_context("mode") != ms.PYNATIVE_MODE:
            self.note = "graph mode: op-name scopes give the phases"
            return False
        plan = [(network, "register_forward_pre_hook", "forward_begin"),
                (network, "register_forward_hook", "forward_end"),
                (network, "register_backward_pre_hook", "backward_begin"),
                (network, "register_backward_hook", "backward_end"),
                (optimizer, "register_forward_pre_hook", "optimizer_begin"),
                (optimizer, "register_forward_hook", "optimizer_end")]
        missed = []
        for cell, method, name in plan:
            register = getattr(cell, method, None) if cell is not None else None
            if register is None:
                continue
            try:
                self._handles.append(register(self._hook(name)))
            except Exception as exc:  # the training must go on without this mark
                missed.append(f"{name} ({type(exc).__name__})")
        if missed:
            self.note = "hooks not registered: " + ", ".join(missed)
        return bool(self._handles)

    def take(self, step: int, rank: int) -> list[dict[str, Any]]:
        """The windows of the marks since the last call, as ``stepscope_steps.json`` rows."""
        events, self.events = self.events, []
        return [{"rank": rank, "step": step, "name": n, "start_us": a, "end_us": b}
                for n, a, b in windows_from_events(events)]

    def detach(self) -> None:
        for h in self._handles:
            try:
                h.remove()
            except Exception:
                pass
        self._handles = []
