"""Alerts that survive their process: recorded as pending before sending, delivered later.

A SIGKILLed trainer (the OOM killer, a scheduler's hard stop) takes its sender thread's
queue with it, and a bounded ``Recorder.close`` leaves a dead endpoint's alerts unsent. So
the dispatcher appends ``{"type": "alert_pending", ...the alert..., "sinks": [...], "pid",
"hostname", "alerts_file"}`` to events.jsonl *before* the alert is queued, and the usual
``{"type": "alert", "id", "delivery": {sink: outcome}}`` once each sink settled it. An
outcome beginning with ``pending`` (:data:`PENDING`) means "not sent yet". A sink listed
in an ``alert_pending`` record with no final outcome for that alert's ``id`` is pending,
whatever order the records are in.

:func:`flush_pending` delivers what is pending through the alert file's sinks of the same
names: ``stepscope alerts flush RUN`` calls it, the ``stepscope run`` launcher calls it when
its command ends (the launcher outlives a killed trainer), and ``stepscope watch`` when it
finds a rank's process gone. Delivery is at least once: an alert whose request reached the
robot just before the kill (answer never recorded) is sent again, marked as late. Alerts of
a process still alive on this host are left to it.

One flusher at a time: a flush holds an exclusive ``flock`` on ``RUN/.alerts-flush.lock``
from reading the pending records until their outcomes are written, and a second flush
meanwhile (the launcher and ``stepscope watch`` at once, two ``alerts flush``) raises
:class:`FlushNotRun` and sends nothing, so no alert goes out twice from two flushes.

Example::

    results = flush_pending(RunDir.open("runs/exp1"), load_alerts_config("alerts.toml"))
    [(r.rule, r.sink, r.outcome) for r in results]   # [("step_time", "wecom#1", "accepted ...")]
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import os
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..rundir.store import RunDir
from .config import AlertsConfig, SinkConfig, load_alerts_config
from .delivery import PENDING, PENDING_TYPE, Dispatcher
from .follow import pid_state
from .model import Alert

__all__ = ["PendingAlert", "FlushResult", "FlushNotRun", "find_pending", "flush_pending",
           "journal_fields", "is_final"]

FLUSH_LOCK = ".alerts-flush.lock"

_LATE = "delivered late (the process that raised it ended before sending it): "


def is_final(outcome: str) -> bool:
    """True unless the outcome says the alert is still to be sent."""
    return not outcome.startswith(PENDING)


def journal_fields(alerts_file: str) -> dict[str, Any]:
    """What a pending record says about where it came from (no secret: a path, a pid)."""
    return {"pid": os.getpid(), "hostname": socket.gethostname(),
            "alerts_file": str(Path(alerts_file).resolve()) if alerts_file else ""}


@dataclass(frozen=True)
class PendingAlert:
    """One alert not yet delivered to ``sinks`` (names in the alert file)."""

    alert: Alert
    sinks: tuple[str, ...]
    pid: int | None
    hostname: str
    alerts_file: str


@dataclass(frozen=True)
class FlushResult:
    """One (alert, sink) outcome of a flush; ``outcome`` starts with ``accepted`` if sent."""

    id: str
    rule: str
    sink: str
    outcome: str

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


class FlushNotRun(RuntimeError):
    """This flush sent nothing: another flush of the run holds its lock, or the run
    directory cannot hold one (read-only) while alerts are pending."""


class _NoLockFile(OSError):
    pass


@contextmanager
def _flush_lock(run: RunDir) -> Iterator[None]:
    path = run.path / FLUSH_LOCK
    try:
        # O_NOFOLLOW: a planted symlink must not make the flush lock (or create) another file.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise _NoLockFile(f"cannot open the flush lock {path} ({exc.strerror}): pending "
                          "alerts are delivered only by a flush that can lock the run "
                          "directory") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise FlushNotRun(f"another flush of {run.path} is delivering its pending "
                            "alerts; nothing sent (run it again once that one ends)") from exc
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays (unlinking it would race a waiter)


def find_pending(events: Iterable[Mapping[str, Any]]) -> list[PendingAlert]:
    """The alerts of ``events`` (events.jsonl records) with a sink still pending."""
    first: dict[str, Mapping[str, Any]] = {}
    wanted: dict[str, set[str]] = {}
    settled: dict[str, set[str]] = {}
    for ev in events:
        aid = ev.get("id")
        if not isinstance(aid, str) or not aid:
            continue
        if ev.get("type") == PENDING_TYPE:
            first.setdefault(aid, ev)
            wanted.setdefault(aid, set()).update(
                str(s) for s in ev.get("sinks") or () if isinstance(s, str))
        elif ev.get("type") == "alert" and isinstance(ev.get("delivery"), Mapping):
            done = settled.setdefault(aid, set())
            for sink, outcome in ev["delivery"].items():
                if is_final(str(outcome)):
                    done.add(str(sink))
    out = []
    for aid, ev in first.items():
        done = settled.get(aid, set())
        left = set() if "all" in done else wanted[aid] - done
        if left:
            pid = ev.get("pid")
            out.append(PendingAlert(Alert.from_dict(ev), tuple(sorted(left)),
                                    pid if isinstance(pid, int) else None,
                                    str(ev.get("hostname", "")), str(ev.get("alerts_file", ""))))
    return out


def _alive_here(p: PendingAlert, state_of: Callable[[int], str | None]) -> bool:
    if p.pid is None or p.hostname != socket.gethostname():
        return False
    if p.pid == os.getpid():  # this process's own dispatcher still holds it
        return True
    return state_of(p.pid) not in (None, "Z")


def flush_pending(run: RunDir, config: AlertsConfig | None = None, *,
                  state_of: Callable[[int], str | None] = pid_state,
                  timeout_s: float = 60.0, observer: str = "flush") -> list[FlushResult]:
    """Deliver the run's pending alerts; one result per (alert, sink) it looked at.

    ``config``: the alert file whose sinks (by name) deliver them; None reads the file each
    pending record names. Outcomes that are not ``accepted`` stay visible in the results
    (``left pending: ...`` when nothing was tried). Raises :class:`FlushNotRun` (having sent
    nothing) while another flush of the same run is under way.
    """
    try:
        with _flush_lock(run):  # raises FlushNotRun while another flush holds the run
            return _flush_locked(run, config, state_of, timeout_s, observer)
    except _NoLockFile as exc:  # a read-only run: fine as long as nothing is pending
        if not find_pending(run.read_events()[0]):
            return []
        raise FlushNotRun(str(exc)) from exc


def _flush_locked(run: RunDir, config: AlertsConfig | None,
                  state_of: Callable[[int], str | None], timeout_s: float,
                  observer: str) -> list[FlushResult]:
    events, _ = run.read_events()
    results: list[FlushResult] = []
    batches: list[tuple[AlertsConfig, tuple[SinkConfig, ...], list[Alert]]] = []
    configs: dict[str, AlertsConfig | str] = {}
    for p in find_pending(events):
        def left(why: str, sinks: Iterable[str], p: PendingAlert = p) -> None:
            results.extend(FlushResult(p.alert.id, p.alert.rule, s, f"left pending: {why}")
                           for s in sinks)
        if _alive_here(p, state_of):
            left(f"process {p.pid} is still running and sends it itself", p.sinks)
            continue
        cfg = config or _load(p.alerts_file, configs)
        if isinstance(cfg, str):
            left(cfg, p.sinks)
            continue
        sinks = tuple(s for s in cfg.sinks if s.name in p.sinks)
        left(f"no sink of that name in {cfg.source or 'the alert file'}",
             sorted(set(p.sinks) - {s.name for s in sinks}))
        if not sinks:
            continue
        late = dataclasses.replace(p.alert, message=_LATE + p.alert.message)
        for c, ss, alerts in batches:
            if c is cfg and ss == sinks:
                alerts.append(late)
                break
        else:
            batches.append((cfg, sinks, [late]))
    for cfg, sinks, alerts in batches:
        results.extend(_deliver(run, cfg, sinks, alerts, timeout_s, observer))
    return results


def _load(path: str, cache: dict[str, AlertsConfig | str]) -> AlertsConfig | str:
    if path not in cache:
        if not path:
            cache[path] = "the record names no alert file: pass one (--alerts FILE)"
        else:
            try:
                cache[path] = load_alerts_config(path)
            except Exception as exc:  # one line: a bad or moved file, an unset secret env
                cache[path] = f"cannot use the alert file: {exc}"
    return cache[path]


def _deliver(run: RunDir, cfg: AlertsConfig, sinks: tuple[SinkConfig, ...],
             alerts: list[Alert], timeout_s: float, observer: str) -> list[FlushResult]:
    records: list[Mapping[str, Any]] = []

    def record(ev: Mapping[str, Any]) -> None:
        if ev.get("type") == "alert":
            records.append(ev)
        run.append_event({**ev, "observer": observer})

    # No cool-down (each was admitted once already) and no gathering wait: all are here.
    d = Dispatcher(sinks, record=record, cooldown_s=0.0, gather_s=0.0,
                   journal=journal_fields(cfg.source))
    for a in alerts:
        d.submit(a)
    d.wait_idle(timeout_s)
    d.close()
    got = {str(r.get("id")): r.get("delivery") for r in records}
    out = []
    for a in alerts:
        delivery = got.get(a.id)
        for s in sinks:
            outcome = delivery.get(s.name) if isinstance(delivery, Mapping) else None
            out.append(FlushResult(a.id, a.rule, s.name, str(
                outcome or f"left pending: no answer within {timeout_s:g} s")))
    return out
