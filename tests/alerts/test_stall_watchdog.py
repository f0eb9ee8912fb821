"""The stall watchdog fires once per stall with the stack naming the blocking call, and
re-arms when steps resume."""

from __future__ import annotations

import threading

from stepscope.alerts.model import Alert
from stepscope.alerts.watchdog import StallWatchdog


def blocking_call_in_the_data_loader(release: threading.Event) -> None:
    release.wait(30.0)  # stands for a read from storage that never returns


def test_hang_fires_with_the_blocking_call_in_the_stack() -> None:
    fired: list[Alert] = []
    steps = [0]
    got_one = threading.Event()
    release = threading.Event()

    def fire(a: Alert) -> None:
        fired.append(a)
        got_one.set()

    def train() -> None:
        for _ in range(5):
            steps[0] += 1
        blocking_call_in_the_data_loader(release)
        steps[0] += 1

    trainer = threading.Thread(target=train)
    trainer.start()
    assert trainer.ident is not None
    dog = StallWatchdog(lambda: steps[0], trainer.ident, limit_s=lambda: 0.5, fire=fire,
                        run="exp", rank=0, poll_s=0.1)
    dog.start()
    assert got_one.wait(20.0)
    release.set()
    trainer.join(10.0)
    dog.stop()
    [alert] = fired
    assert alert.rule == "stall" and alert.severity == "critical" and alert.step == 5
    assert "blocking_call_in_the_data_loader" in alert.detail
    assert "release.wait(30.0)" in alert.detail
    assert "the training thread is in wait" in alert.message
    assert alert.values["stalled_s"] >= 0.5


def test_progress_rearms_and_no_progress_fires_again_once() -> None:
    dog = StallWatchdog(lambda: 0, threading.get_ident(), limit_s=lambda: 10.0,
                        fire=lambda a: None, run="exp", rank=1, clock=lambda: 0.0)
    seq = [(5.0, 0), (11.0, 0), (30.0, 0), (31.0, 1), (40.0, 1), (42.0, 1), (50.0, 1)]
    fired = [dog.check(t, n) for t, n in seq]
    assert [(a.step, a.values["stalled_s"]) for a in fired if a] == [(0, 11.0), (1, 11.0)]
    assert [a is not None for a in fired] == [False, True, False, False, False, True, False]
