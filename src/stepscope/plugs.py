"""The plug board: what a Recorder runs beside its writer thread, chosen by name.

A *plug* receives every batch of step records just written (on the recorder's writer
thread, never the training thread; a plug that raises is warned about once and dropped)
and ``close(status)`` when the recorder closes ("finished" or "failed"), after the last
batch went through it. A *factory* makes one plug for one recorder from a
:class:`PlugContext`, or returns None when it has nothing to do.

The board knows the built-in plugs by name and imports each only when it is configured,
so ``import stepscope`` and a plain Recorder stay light:

=============  =====================================================  ======================
plug           switched on by                                         lives in
=============  =====================================================  ======================
alerts         ``Recorder(alerts=FILE)`` or ``$STEPSCOPE_ALERTS``     ``alerts.monitor``
metrics        ``Recorder(metrics_port=P)`` or                        ``alerts.monitor``
               ``$STEPSCOPE_METRICS_PORT`` (counts the alerts too)
live_export    ``$STEPSCOPE_TENSORBOARD`` / ``$STEPSCOPE_MLFLOW``     ``report.live_export``
               (``stepscope run --tensorboard/--mlflow``)
=============  =====================================================  ======================

Third-party plugs: :func:`register_plug` starts a factory on every Recorder made after it
in this process. A package can instead declare an entry point in the group
``stepscope.plugs`` (``name = "pkg.module:factory"``); it is started when asked for by
name, ``Recorder(plugs=["name"])`` or ``$STEPSCOPE_PLUGS=name,other`` (e.g. under
``stepscope run``), and the installed entry points are read only then.

Example::

    from stepscope.plugs import register_plug

    class LossPrinter:
        def __init__(self, ctx):
            self.rank = ctx.rank
        def on_records(self, records):          # the recorder's writer thread
            for r in records:
                if "loss" in r:
                    print(self.rank, r["step"], r["loss"])
        def close(self, status):
            print("run", status)

    register_plug("loss_printer", LossPrinter)
    with stepscope.Recorder("runs/exp1") as rec:   # starts LossPrinter(ctx)
        ...

The recorder knows this board only: nothing in ``stepscope.record`` names an alerts or
report module, and this is the one module (beside the packages' own lazy loaders) that
imports a stepscope module by name (tests/core/test_house.py checks both).
"""

from __future__ import annotations

import importlib
import os
import types
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .errors import ConfigError

if TYPE_CHECKING:
    from .rundir.store import RunDir

__all__ = ["Plug", "PlugContext", "PlugFactory", "Plugs", "register_plug", "unregister_plug",
           "start_plugs", "metrics_port", "ENTRY_POINT_GROUP", "PLUGS_ENV", "ALERTS_ENV",
           "METRICS_PORT_ENV", "TENSORBOARD_ENV", "MLFLOW_ENV", "MLFLOW_EXPERIMENT_ENV"]

# The environment variables that switch plugs on in any entry point (the launcher sets
# them for its children; alerts/ and report/ read their values from here).
ALERTS_ENV = "STEPSCOPE_ALERTS"  # an alert file (TOML) for every Recorder of the process
METRICS_PORT_ENV = "STEPSCOPE_METRICS_PORT"  # Prometheus /metrics on this port + local rank
# `stepscope run --tensorboard DIR --mlflow URI`: live export from every Recorder's writer
# thread (report/live_export.py).
TENSORBOARD_ENV = "STEPSCOPE_TENSORBOARD"
MLFLOW_ENV = "STEPSCOPE_MLFLOW"
MLFLOW_EXPERIMENT_ENV = "STEPSCOPE_MLFLOW_EXPERIMENT"
PLUGS_ENV = "STEPSCOPE_PLUGS"  # comma-separated plug names to start on every Recorder
ENTRY_POINT_GROUP = "stepscope.plugs"

# One batch of step records as written (dicts as in the step file; a value logged after its
# step closed arrives as a partial record with the same rank and step).
Records = list[dict[str, Any]]


class Plug(Protocol):
    """What the board asks of a plug."""

    def on_records(self, records: Records) -> None: ...

    def close(self, status: str) -> None: ...


@dataclass(frozen=True)
class PlugContext:
    """What a factory is given: the recorder's run and rank, and what it was asked for.

    ``progress``: steps recorded so far (a stall watchdog's pulse). ``alerts`` and
    ``metrics_port``: the Recorder's own arguments (None: the environment decides).
    ``started``: the plugs already started on this recorder, by name, in board order.
    """

    run: RunDir
    rank: int
    progress: Callable[[], int]
    alerts: str | os.PathLike[str] | None = None
    metrics_port: int | None = None
    started: Mapping[str, Plug] = field(default_factory=dict)


PlugFactory = Callable[[PlugContext], Plug | None]


def _alerts_configured(ctx: PlugContext) -> bool:
    return ctx.alerts is not None or bool(os.environ.get(ALERTS_ENV))


def _metrics_configured(ctx: PlugContext) -> bool:
    return ctx.metrics_port is not None or bool(os.environ.get(METRICS_PORT_ENV, "").strip())


def _export_configured(ctx: PlugContext) -> bool:
    return bool(os.environ.get(TENSORBOARD_ENV) or os.environ.get(MLFLOW_ENV))


# name -> ("module:factory", when it is configured), in start order: the metrics plug
# comes after the alerts plug because it counts the alerts (PlugContext.started).
_BUILT_IN: dict[str, tuple[str, Callable[[PlugContext], bool]]] = {
    "alerts": ("stepscope.alerts.monitor:alerts_plug", _alerts_configured),
    "metrics": ("stepscope.alerts.monitor:metrics_plug", _metrics_configured),
    "live_export": ("stepscope.report.live_export:plug", _export_configured),
}
_REGISTERED: dict[str, PlugFactory] = {}


def register_plug(name: str, factory: PlugFactory) -> None:
    """Start ``factory(ctx)`` on every Recorder made from now on in this process.

    The factory returns a :class:`Plug`, or None to stay off for that recorder. Raises
    :class:`ConfigError` when ``name`` is taken (a built-in plug, or registered before).
    """
    if name in _BUILT_IN or name in _REGISTERED:
        raise ConfigError(f"a plug named {name!r} exists already; unregister_plug({name!r}) "
                          "first or choose another name")
    if not callable(factory):
        raise ConfigError(f"plug {name!r}: expected a factory (callable taking a "
                          f"PlugContext), got {type(factory).__name__}")
    _REGISTERED[name] = factory


def unregister_plug(name: str) -> None:
    """Stop starting ``name`` on new recorders (started plugs run on); unknown: no-op."""
    _REGISTERED.pop(name, None)


def metrics_port(explicit: int | None) -> int | None:
    """The Prometheus port: ``explicit``, else ``$STEPSCOPE_METRICS_PORT``; None when
    neither (a value that is not a port is warned about: metrics off, training goes on)."""
    if explicit is not None:
        return int(explicit)
    value = os.environ.get(METRICS_PORT_ENV, "").strip()
    if not value:
        return None
    if not value.isdigit():
        warnings.warn(f"stepscope: {METRICS_PORT_ENV}={value!r} is not a port; metrics off",
                      RuntimeWarning, stacklevel=2)
        return None
    return int(value)


def _load(target: str) -> PlugFactory:
    module, _, attr = target.partition(":")
    factory: PlugFactory = getattr(importlib.import_module(module), attr)
    return factory


def _entry_point(name: str) -> PlugFactory | None:
    """The factory an installed package declares as ``name`` in the group, if any."""
    from importlib.metadata import entry_points  # slow to scan: only when asked for

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            factory: PlugFactory = ep.load()
            return factory
    return None


def _env_names() -> list[str]:
    return [n.strip() for n in os.environ.get(PLUGS_ENV, "").split(",") if n.strip()]


def _factories(ctx: PlugContext, asked: Sequence[str]) -> Iterator[tuple[str, PlugFactory]]:
    """(name, factory) of every plug to start, in start order, each imported only now."""
    env = [n for n in _env_names() if n not in asked]
    for name, (target, configured) in _BUILT_IN.items():
        if configured(ctx) or name in asked or name in env:
            yield name, _load(target)
    yield from list(_REGISTERED.items())
    for name in dict.fromkeys([*asked, *env]):
        if name in _BUILT_IN or name in _REGISTERED:
            continue
        factory = _entry_point(name)
        if factory is not None:
            yield name, factory
            continue
        msg = (f"plug {name!r} is neither registered (stepscope.plugs.register_plug) nor "
               f"installed (entry point group {ENTRY_POINT_GROUP!r})")
        if name in asked:  # the caller's own argument: a mistake to stop at
            raise ConfigError(msg + "; install the package that provides it or drop the name")
        warnings.warn(f"stepscope: {msg} (from ${PLUGS_ENV}); skipped", RuntimeWarning,
                      stacklevel=4)


class _Host(Protocol):
    """The recorder, as far as the board sees it."""

    rank: int
    run: RunDir

    @property
    def steps_recorded(self) -> int: ...

    def add_listener(self, fn: Callable[[Records], None]) -> None: ...


class Plugs:
    """The plugs started on one recorder, in start order; closed with it."""

    def __init__(self, started: Mapping[str, Plug]) -> None:
        self._started = dict(started)

    def get(self, name: str) -> Plug | None:
        return self._started.get(name)

    @property
    def names(self) -> list[str]:
        return list(self._started)

    def close(self, status: str = "finished") -> None:
        """Close every plug with the run's status; one that raises is warned about (the
        recorder still writes run.json)."""
        for name, plug in self._started.items():
            try:
                plug.close(status)
            except Exception as exc:
                warnings.warn(f"stepscope: plug {name!r} did not close cleanly: {exc}",
                              RuntimeWarning, stacklevel=2)
        self._started.clear()


def start_plugs(rec: _Host, *, alerts: str | os.PathLike[str] | None = None,
                metrics_port: int | None = None, names: Sequence[str] = ()) -> Plugs:
    """Start the configured, registered and asked-for plugs on ``rec``'s listener seam.

    ``names``: plugs asked for by the caller (an unknown one raises :class:`ConfigError`);
    ``$STEPSCOPE_PLUGS`` adds more (an unknown one is warned about). A factory that raises
    closes the plugs started before it ("failed") and the error propagates.
    """
    started: dict[str, Plug] = {}
    ctx = PlugContext(run=rec.run, rank=rec.rank, progress=lambda: rec.steps_recorded,
                      alerts=alerts, metrics_port=metrics_port,
                      started=types.MappingProxyType(started))
    try:
        for name, factory in _factories(ctx, list(names)):
            plug = factory(ctx)
            if plug is None:
                continue
            if not (callable(getattr(plug, "on_records", None))
                    and callable(getattr(plug, "close", None))):
                raise ConfigError(f"plug {name!r}: its factory returned a "
                                  f"{type(plug).__name__}, which lacks on_records(records) "
                                  "or close(status)")
            rec.add_listener(plug.on_records)
            started[name] = plug
    except BaseException:
        Plugs(started).close("failed")
        raise
    return Plugs(started)
