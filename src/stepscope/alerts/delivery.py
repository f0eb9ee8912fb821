"""Delivery that never blocks or slows training: a bounded queue and one sender thread.

``submit`` is the only call made where alerts are raised; it puts the alert on a bounded
queue without waiting (a full queue drops it and counts it). One daemon thread does the
rest: the cool-down per alert key, each sink's ``min_severity``, the platform's rate limit
(a sliding window per sink), retries with backoff and a timeout on every request. Alerts
that arrive while a sink must wait (rate limit, retry back-off, a throttled robot) pile up
in that sink's outbox and leave as one folded summary, so a storm is neither lost nor sent
as a burst. When every sink has settled an alert, one ``{"type": "alert"}`` record with each
sink's outcome goes to ``record`` (events.jsonl). Nothing here writes a URL or a secret.

With ``journal`` (where the alert came from: pid, host, alert file), each alert is first
recorded as ``{"type": "alert_pending", ..., "sinks": [...]}``, before it is queued, so
an alert the process could not send (SIGKILL, a dead endpoint at exit) is still on disk;
``alerts/pending.py`` delivers those later. ``close`` waits at most ``CLOSE_WAIT_S``.

Example::

    d = Dispatcher(config.sinks, record=run.append_event, cooldown_s=300)
    d.submit(alert)          # returns at once
    d.close()                # at exit: last tries within CLOSE_WAIT_S; the rest stay pending
"""

from __future__ import annotations

import queue
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

from .config import SinkConfig
from .limits import CoolDown, WindowLimiter
from .message import render
from .model import Alert, severity_rank
from .platforms import PLATFORMS, Outcome, build, interpret
from .transport import HttpAnswer, post

__all__ = ["Dispatcher", "Poster", "CLOSE_WAIT_S", "PENDING", "PENDING_TYPE"]

Poster = Callable[..., HttpAnswer]
_STOP = object()
# Retry back-off after a failed request: 1, 2, 4 ... s, at most 60 s (a dead endpoint is
# tried a few times, not hammered).
_BACKOFF_BASE_S = 1.0
_BACKOFF_MAX_S = 60.0
# A first alert waits this long for others raised with it (a rule firing on every rank at
# once), so they leave as one message.
_GATHER_S = 0.25
# A sink's outbox keeps at most this many alerts in full; more are counted, not kept.
_MAX_OUTBOX = 200
# ``close`` (a recorder closing, the process exiting) waits at most this long for the
# sender: one request to a live robot answers in well under a second, and a dead or
# black-holed endpoint must not hold a finished job (it used to take up to a 5 s request
# timeout). What is not settled by then stays pending in events.jsonl.
CLOSE_WAIT_S = 1.0
# An outcome that starts with this is not final: the alert is still to be sent.
PENDING = "pending"
PENDING_TYPE = "alert_pending"
_EXITING = f"{PENDING}: the process ended before delivery (`stepscope alerts flush RUN`)"


@dataclass
class _Sink:
    cfg: SinkConfig
    limiter: WindowLimiter
    outbox: list[Alert] = field(default_factory=list)
    overflow: int = 0
    attempts: int = 0
    next_try_s: float = 0.0
    sent: int = 0

    def due(self, now: float) -> float:
        return max(self.next_try_s, self.limiter.next_free(now))


@dataclass
class _Pending:
    alert: Alert
    waiting: int
    delivery: dict[str, str] = field(default_factory=dict)


def _windows(cfg: SinkConfig) -> tuple[tuple[int, float], ...]:
    if cfg.rate_limit and cfg.rate_window_s:
        return ((cfg.rate_limit, cfg.rate_window_s),)
    return PLATFORMS[cfg.type].windows


class Dispatcher:
    """Routes alerts to sinks from one daemon thread; see the module docstring."""

    def __init__(self, sinks: Sequence[SinkConfig], *,
                 record: Callable[[Mapping[str, Any]], None] | None = None,
                 cooldown_s: float = 300.0, queue_size: int = 1000,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, poster: Poster = post,
                 console: TextIO | None = None, gather_s: float = _GATHER_S,
                 journal: Mapping[str, Any] | None = None) -> None:
        self._sinks = [_Sink(s, WindowLimiter(_windows(s))) for s in sinks]
        self._record = record
        self._journal = dict(journal) if journal is not None and record is not None else None
        self._cool = CoolDown(cooldown_s)
        self._queue: queue.Queue[object] = queue.Queue(maxsize=queue_size)
        self._clock, self._wall, self._post = clock, wall, poster
        self._console = console
        self._gather_s = gather_s
        self._pending: dict[int, _Pending] = {}
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._closing = False
        self.dropped = 0  # alerts refused because the queue was full
        self.submitted = 0
        self._thread = threading.Thread(target=self._loop, name="stepscope-alerts",
                                        daemon=True)
        self._thread.start()

    # -- the caller's side (any thread, never blocks) ---------------------------------
    def submit(self, alert: Alert) -> bool:
        """Queue ``alert``; False (and counted) if the queue is full or closed. With a
        journal it is recorded as pending first (a full queue leaves it pending)."""
        if not alert.id:
            alert = replace(alert, id=uuid.uuid4().hex[:16])
        if self._journal is not None:
            self._note_pending(alert)
        try:
            self._queue.put_nowait(alert)
        except queue.Full:
            self.dropped += 1
            return False
        self.submitted += 1
        return True

    def _note_pending(self, alert: Alert) -> None:
        sinks = [s.cfg.name for s in self._sinks if s.cfg.type != "console"
                 and severity_rank(alert.severity) >= severity_rank(s.cfg.min_severity)]
        if not sinks or self._record is None:
            return  # nothing a later flush could send (a console line is for this process)
        try:
            self._record({"type": PENDING_TYPE, **alert.to_dict(), "sinks": sinks,
                          **(self._journal or {})})
        except Exception:  # the recorder warns itself; submit never raises
            pass

    def sent_counts(self) -> dict[str, int]:
        """Messages each sink's endpoint accepted so far."""
        return {s.cfg.name: s.sent for s in self._sinks}

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until every queued alert is settled; True if that happened in time."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._queue.unfinished_tasks or self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(min(left, 0.05))
        return True

    def close(self, timeout_s: float = CLOSE_WAIT_S) -> None:
        """Last tries within ``timeout_s`` (the sender thread is joined with it, never
        longer); what is still unsent is recorded with a ``pending`` outcome."""
        self._closing = True  # seen by the sender even when the queue is full
        try:
            self._queue.put_nowait(_STOP)
        except queue.Full:
            pass
        self._thread.join(timeout_s)
        with self._lock:
            left = list(self._pending.values())
            self._pending.clear()
        for p in left:
            for s in self._sinks:
                p.delivery.setdefault(s.cfg.name, _EXITING)
            self._write(p)

    # -- the sender thread --------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            try:
                if self._step():
                    return
            except Exception as exc:  # a bug here must cost alerts, never the training job
                # The type only: an exception's text could quote a webhook URL (a secret).
                print(f"stepscope: alert delivery error (continuing): {type(exc).__name__}",
                      file=sys.stderr)
                time.sleep(1.0)

    def _step(self) -> bool:
        """One round: take what is queued, send what is due; True once told to stop."""
        timeout = self._next_due()
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            item = None
        items = [] if item is None else [item]
        while True:  # drain what else is queued: a burst is folded, not sent one by one
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        stopping = self._closing
        for it in items:
            if it is _STOP:
                stopping = True
            elif isinstance(it, Alert):
                self._accept(it)
            self._queue.task_done()
        self._send_due(final=stopping)
        if stopping:
            self._abandon(_EXITING + " (a rate limit or retry wait)")
        return stopping

    def _next_due(self) -> float | None:
        now = self._clock()
        due = [s.due(now) for s in self._sinks if s.outbox]
        return None if not due else max(0.0, min(due) - now)

    def _accept(self, alert: Alert) -> None:
        entry = _Pending(alert, 0)
        if not self._cool.admit(alert.key, self._clock()):
            entry.delivery = {"all": "suppressed: same alert within the cool-down"}
            self._write(entry)
            return
        for s in self._sinks:
            if severity_rank(alert.severity) < severity_rank(s.cfg.min_severity):
                entry.delivery[s.cfg.name] = f"skipped: below min_severity {s.cfg.min_severity}"
            elif len(s.outbox) >= _MAX_OUTBOX:
                s.overflow += 1
                entry.delivery[s.cfg.name] = "folded: counted in the next summary"
            else:
                if not s.outbox:
                    s.next_try_s = max(s.next_try_s, self._clock() + self._gather_s)
                s.outbox.append(alert)
                entry.waiting += 1
        if entry.waiting == 0:
            self._write(entry)
        else:
            with self._lock:
                self._pending[id(alert)] = entry

    def _send_due(self, final: bool) -> None:
        for s in self._sinks:
            now = self._clock()
            if s.outbox and now >= s.due(now):
                self._send(s, now)
            if final and s.outbox and s.attempts == 0:
                # One last try at exit if the limit allows it now; otherwise it is recorded.
                now = self._clock()
                if now >= s.limiter.next_free(now):
                    self._send(s, now)

    def _send(self, s: _Sink, now: float) -> None:
        batch = list(s.outbox)
        outcome = self._deliver(s, batch)
        # Counted at the answer, not at the send: the robot counted it on arrival, which is
        # no later, so the window the limiter keeps is never shorter than the robot's.
        s.limiter.record(self._clock())
        s.attempts += 1
        folded = f" (folded with {len(batch) - 1 + s.overflow} more)" if len(batch) > 1 else ""
        if outcome.accepted:
            s.sent += 1
            self._settle(s, batch, f"accepted{folded}: {outcome.detail}")
        elif outcome.status == "throttled":
            s.next_try_s = now + (outcome.retry_after_s or PLATFORMS[s.cfg.type].throttled_for_s)
            s.attempts -= 1  # the platform asked to wait: not a failed attempt
        elif outcome.status == "retry" and s.attempts <= s.cfg.retries:
            s.next_try_s = now + min(_BACKOFF_MAX_S, _BACKOFF_BASE_S * 2 ** (s.attempts - 1))
        else:
            n = s.attempts
            self._settle(s, batch, f"failed after {n} attempt{'s' * (n > 1)}: {outcome.detail}")

    def _deliver(self, s: _Sink, batch: list[Alert]) -> Outcome:
        msg = render(batch, s.cfg.keyword, dropped=s.overflow)
        if s.cfg.type == "console":
            return self._console_line(msg.text)
        req = build(s.cfg, msg, [a.to_dict() for a in batch], self._wall())
        answer = self._post(req, s.cfg.timeout_s)
        out = interpret(s.cfg.type, answer.status, answer.body, answer.headers, answer.error)
        return Outcome(out.status, _redact(out.detail, s.cfg), out.retry_after_s)

    def _console_line(self, text: str) -> Outcome:
        stream = self._console or sys.stderr
        line = " | ".join(part for part in text.splitlines()[:3])
        try:
            red = stream.isatty()
            stream.write(f"\x1b[1;31m{line}\x1b[0m\n" if red else f"{line}\n")
            stream.flush()
        except (OSError, ValueError) as exc:  # a closed or broken stderr
            return Outcome("rejected", f"console: {exc}")
        return Outcome("accepted", "printed")

    def _settle(self, s: _Sink, batch: list[Alert], outcome: str) -> None:
        s.outbox.clear()
        s.overflow = 0
        s.attempts = 0
        s.next_try_s = 0.0
        done = []
        with self._lock:
            for a in batch:
                p = self._pending.get(id(a))
                if p is None:
                    continue
                p.delivery[s.cfg.name] = outcome
                p.waiting -= 1
                if p.waiting <= 0:
                    done.append(self._pending.pop(id(a)))
        for p in done:
            self._write(p)

    def _abandon(self, why: str) -> None:
        for s in self._sinks:
            if s.outbox:
                self._settle(s, list(s.outbox), why)

    def _write(self, p: _Pending) -> None:
        if self._record is not None:
            try:
                self._record({"type": "alert", **p.alert.to_dict(), "delivery": p.delivery})
            except Exception:  # the recorder warns itself; never kill the sender thread
                pass
        with self._idle:
            self._idle.notify_all()


def _redact(text: str, cfg: SinkConfig) -> str:
    for secret in (cfg.url, cfg.secret):
        if secret:
            text = text.replace(secret, "<redacted>")
    return text
