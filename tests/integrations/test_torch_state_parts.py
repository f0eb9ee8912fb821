"""The parts of the zero-code state, one by one: exact numbers, no clock, no hooks.

Each part of :class:`stepscope.integrations.torch.state.AutoState` is changed only
through its own methods; these pin what those methods do with hand-computable inputs.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from stepscope.integrations.torch.accum import CONVENTION, Accumulation
from stepscope.integrations.torch.batches import BatchCounter
from stepscope.integrations.torch.between import RECUR, LosslessRun
from stepscope.integrations.torch.closure import ClosureStep
from stepscope.integrations.torch.failures import Failures
from stepscope.integrations.torch.fingerprint import Fingerprint
from stepscope.integrations.torch.loops import EvalWatch
from stepscope.integrations.torch.pending import OpenStep, PendingSteps, StepData
from stepscope.integrations.torch.phases import PhaseClock
from stepscope.integrations.torch.profiling import ProfileWindow
from stepscope.integrations.torch.settings import Settings


def _phase_clock() -> PhaseClock:
    return PhaseClock(torch, ProfileWindow(torch, None, "", Failures()))


def test_phase_clock_names_the_phase_by_depth_and_backward() -> None:
    clock = _phase_clock()
    assert clock.now() == "other"
    clock.push(1)
    clock.enter()
    clock.push(1)
    clock.enter()  # a submodule of the forward
    assert clock.now() == "forward" and clock.depth == 2
    assert clock.pop() == 1 and not clock.leave()  # the submodule ended: still inside
    assert clock.pop() == 1 and clock.leave()  # the outermost call ended
    assert clock.now() == "other" and clock.pop() is None  # nothing left to pop
    clock.backward(True)
    assert clock.now() == "backward"
    clock.backward(False)
    assert clock.now() == "other"


def test_phase_clock_on_cpu_adds_no_device_marks() -> None:
    clock = _phase_clock()
    dev: list[tuple[str, object, object]] = []
    clock.begin("forward")
    clock.end("forward", dev)
    assert dev == []


def test_open_step_begins_once_and_finish_starts_the_next_at_the_end() -> None:
    step = OpenStep()
    step.begin(5.0)
    step.begin(6.0)  # already started: the first start stands
    assert step.open and step.cur.t_start == 5.0
    step.cur.micro = 2
    done = step.finish(9.0)
    assert (done.t_start, done.micro) == (5.0, 2)
    assert (step.open, step.index, step.cur.t_start, step.cur.micro) == (False, 1, 9.0, 0)


class _DeviceEvent:
    """Stands in for a CUDA event (``query``/``synchronize``), which a CPU host has not."""

    def __init__(self, done: bool) -> None:
        self.done = done
        self.synced = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.synced = True
        self.done = True


def test_pending_steps_wait_for_the_device_at_most_two_steps() -> None:
    pending, failures = PendingSteps(), Failures()
    events = [_DeviceEvent(False) for _ in range(3)]
    for ev in events:
        pending.push(StepData(done_event=ev))
    pending.flush(False, None, Settings(run_dir="unused"), False, failures)
    # three queued, none done: the oldest is waited for, then two may stay behind
    assert [ev.synced for ev in events] == [True, False, False]
    assert len(pending.queue) == 2
    events[1].done = True
    pending.flush(False, None, Settings(run_dir="unused"), False, failures)
    assert len(pending.queue) == 1 and not events[1].synced
    pending.flush(True, None, Settings(run_dir="unused"), False, failures)
    assert pending.queue == [] and events[2].synced and failures.count == 0


def test_accumulation_reads_the_unscaled_loss_and_confirms_k_once() -> None:
    acc = Accumulation()
    w = nn.Parameter(torch.tensor(3.0))
    loss = (w * 2.0) / 4
    scaled = loss * 1024.0  # what GradScaler.scale would hand to backward
    acc.scaled("scaler", scaled, loss)
    assert acc.loss_of(scaled) is loss and acc.scaler == "scaler"
    acc.before_backward(scaled, replay=False)
    assert acc.divisor == 4.0  # the unscaled loss's divisor, not the scaling's
    acc.before_backward(scaled, replay=True)  # a closure's re-evaluation: none read
    assert acc.divisor is None
    assert acc.confirm([4.0, 4.0]) is None  # 2 micro-batches / 4: not k
    assert acc.confirm([4.0] * 4) == CONVENTION.format(k=4.0) and acc.k == 4.0
    assert acc.confirm([2.0] * 2) is None and acc.k == 4.0  # the first k stands
    acc.end_step()
    assert acc.loss_of(scaled) is scaled


def test_closure_step_is_inside_its_first_evaluation_until_done() -> None:
    cl = ClosureStep()
    assert not cl.inside_first()  # no closure step open
    cl.start([{"params": []}])
    assert cl.inside_first()
    cl.evaluated(0.25)
    cl.first_done()
    cl.evaluated(0.5)  # LBFGS's line search: time counts, not the first evaluation
    assert not cl.inside_first() and cl.seconds == 0.75
    cl.reset()
    assert (cl.seconds, cl.done, cl.groups) == (0.0, False, None)


def test_batch_counter_counts_loader_batches_and_seq_first_inputs() -> None:
    counter, baseline = BatchCounter(torch), {}
    d = StepData()
    counter.loader_batch(d, torch.zeros(4, 16, dtype=torch.long), 0.25, baseline)
    assert counter.saw_loader
    assert (d.data_wait, d.loader_batches, d.loader_tokens, d.loader_samples) == \
        (0.25, 1, 64.0, 4.0)
    assert baseline == {"batch_shape": [4, 16], "micro_batch": 4, "seq_len": 16}
    counter.sequence_first("LSTM")  # [seq, batch] inputs: 35 x 4
    counter.model_inputs(d, (torch.zeros(35, 4, dtype=torch.long),), baseline)
    assert counter.counted and (d.fwd_tokens, d.fwd_samples, d.fwd_counted) == (140.0, 4.0, 1)
    counter.model_inputs(d, (torch.zeros(4, 3),), baseline)  # floats: no token ids
    assert not counter.counted and d.fwd_counted == 1


def test_lossless_run_recurs_after_recur_steps_in_a_row() -> None:
    run = LosslessRun()
    assert [run.count(True) for _ in range(RECUR)] == [False] * (RECUR - 1) + [True]
    assert not run.count(False) and run.steps == 0


def test_eval_watch_opens_and_ends_an_evaluation_forward() -> None:
    watch = EvalWatch()
    watch.trained(7)
    watch.start(False, 7, 1.5, 32.0)
    assert (watch.open, watch.pre, watch.key, watch.t0, watch.weight) == \
        (True, False, 7, 1.5, 32.0)
    watch.end()
    assert not watch.open and watch.train_params == {7}


def test_fingerprint_notes_and_precision() -> None:
    fp = Fingerprint()
    fp.note_once("between_steps", {"from_step": 3})
    fp.note_once("between_steps", {"from_step": 9})  # the first stands
    fp.note("loss_convention", "a")
    fp.note("loss_convention", "b")  # the latest stands
    fp.describe_once("optimizer", "manual update")
    assert fp.config == {"between_steps": {"from_step": 3}, "loss_convention": "b"}
    assert fp.precision() == "fp32"
    fp.baseline.update(param_dtype="float32", autocast_dtype="bfloat16")
    assert fp.precision() == "bf16-mixed"


def test_fingerprint_reads_the_models_device_and_dtype() -> None:
    fp = Fingerprint()
    assert fp.note_model(torch, nn.Linear(2, 3)) is False  # on the CPU
    assert fp.baseline["param_dtype"] == "float32" and fp.baseline["model_name"] == "Linear"
    assert fp.mem_probe is not None and "mem_source" in fp.config


def test_failures_are_counted_and_warned_about_once() -> None:
    failures = Failures()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        failures.failed("forward hook", ValueError("x"))
        failures.failed("forward hook", ValueError("y"))
    assert failures.count == 2
    assert [str(w.message) for w in seen] == [
        "stepscope: forward hook failed (ValueError: x); training continues, this "
        "measurement may be incomplete"]

