"""Pure pieces of the zero-code instrumentation for third-party loops: the
between-steps booking, the accumulation divisor, closure wrapping, batch layout and
embedding lookups — each on real torch objects."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from stepscope.calc import flopsrun
from stepscope.integrations.torch import accum, between, closure, layout
from stepscope.integrations.torch.evalloss import EvalLosses
from stepscope.integrations.torch.firststep import PROBE_NOTE, PreTraining
from stepscope.integrations.torch.pending import StepData


def test_between_steps_time_moves_the_step_start_and_clears_eval_fetches() -> None:
    d = StepData(t_start=10.0)
    d.data_wait, d.loader_batches, d.loader_tokens, d.tool = 0.4, 3, 96.0, 0.05
    assert between.book(d, "eval", 12.0)
    assert d.extra == {"eval_s": pytest.approx(1.95)}
    assert (d.t_start, d.data_wait, d.loader_batches, d.loader_tokens, d.tool) == \
        (12.0, 0.0, 0, 0.0, 0.0)
    assert between.book(d, "checkpoint", 12.5)
    assert d.extra["checkpoint_s"] == pytest.approx(0.5)


def test_between_steps_booking_stops_once_training_work_began() -> None:
    d = StepData(t_start=10.0)
    d.fwd_calls = 1  # a grad-enabled forward of the model: a no-grad forward now is the step's
    assert not between.book(d, "eval", 11.0)
    assert d.t_start == 10.0 and d.extra == {}
    assert not between.book(StepData(), "eval", 1.0)  # no step open: nothing to move


def test_eval_forward_is_the_trained_model_or_an_eval_module_before_training() -> None:
    model, teacher = nn.Linear(2, 2), nn.Linear(2, 2)
    trained = {between.first_param_id(model)}
    assert between.is_eval_forward(model, trained, before_training=False)
    teacher.eval()
    assert not between.is_eval_forward(teacher, trained, before_training=False)
    assert between.is_eval_forward(teacher, set(), before_training=True)
    assert not between.is_eval_forward(nn.ReLU(), trained, before_training=True)


def test_divisor_reads_a_constant_scaling_only() -> None:
    x = torch.randn(4, requires_grad=True)
    loss = (x ** 2).mean()
    assert accum.divisor(loss / 4) == 4.0
    assert accum.divisor(loss * 0.5) == 2.0
    assert accum.divisor(loss) is None
    assert accum.divisor(loss / x.sum()) is None  # the divisor is itself trained
    assert accum.divisor(loss / 1) is None


def test_partial_step_loss_is_the_mean_once_the_divisor_is_confirmed() -> None:
    assert accum.confirms([2.0, 2.0]) == 2.0
    assert accum.confirms([2.0]) is None and accum.confirms([496.0, 496.0]) is None
    # accelerate at an epoch's end: one micro-batch, divided by 2
    assert accum.step_loss([5.94 / 2], [2.0], confirmed=2.0) == pytest.approx(5.94)
    assert accum.step_loss([1.0, 2.0], [2.0, 2.0], confirmed=2.0) == 3.0
    assert accum.step_loss([5.94 / 2], [2.0], confirmed=None) == pytest.approx(2.97)


def test_closure_wrapper_times_each_evaluation_and_keeps_the_result() -> None:
    ticks = iter([0.0, 1.5, 2.0, 2.25])
    seen: list[tuple[int, float]] = []
    wrapped = closure.wrap(lambda: "loss", lambda: next(ticks),
                           lambda i, s: seen.append((i, s)))
    assert wrapped() == "loss" and wrapped() == "loss"
    assert seen == [(0, 1.5), (1, 0.25)]
    opt = object()  # a step pre-hook sees (optimizer, *args)
    args, kwargs = closure.replace_closure((opt,), {"closure": print}, wrapped)
    assert kwargs["closure"] is wrapped and closure.closure_of(args, kwargs) is wrapped
    args, kwargs = closure.replace_closure((opt, print), {}, wrapped)
    assert args == (opt, wrapped) and closure.closure_of(args, kwargs) is wrapped
    assert closure.closure_of((opt,), {}) is None


def test_lbfgs_step_runs_the_wrapped_closure() -> None:
    w = nn.Parameter(torch.tensor([3.0]))
    opt = torch.optim.LBFGS([w], max_iter=3)
    calls: list[int] = []

    def f() -> torch.Tensor:
        opt.zero_grad()
        loss = (w ** 2).sum()
        loss.backward()
        return loss

    def swap(o: object, args: tuple, kwargs: dict) -> tuple:
        fn = closure.closure_of(args, kwargs)
        timed = closure.wrap(fn, lambda: 0.0, lambda i, s: calls.append(i))
        return closure.replace_closure(args, kwargs, timed)

    handle = opt.register_step_pre_hook(swap)  # as stepscope's global pre-hook does
    try:
        first = opt.step(f)
    finally:
        handle.remove()
    assert float(first.detach()) == 9.0 and calls[:2] == [0, 1]


class _WordLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Embedding(50, 16)
        self.rnn = nn.LSTM(16, 16, 2)
        self.decoder = nn.Linear(16, 50)


def test_sequence_first_from_the_models_own_layers() -> None:
    assert layout.sequence_first(_WordLM()) == "nn.LSTM rnn: batch_first=False"
    batch_first = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, batch_first=True),
                                        1, enable_nested_tensor=False)
    assert layout.sequence_first(batch_first) is None
    assert layout.sequence_first(nn.Sequential(nn.Embedding(8, 4), nn.Linear(4, 8))) is None


def test_lookup_only_embeddings_untied_counted_tied_kept() -> None:
    assert layout.lookup_only_params(_WordLM()) == 50 * 16
    tied = nn.Sequential(nn.Embedding(8, 4), nn.Linear(4, 8, bias=False))
    tied[1].weight = tied[0].weight
    assert layout.lookup_only_params(tied) == 0
    fields = flopsrun.six_n_matmul(1000, 200)
    assert fields["flops_per_token"] == 4800.0 and "200 embedding-lookup" in \
        fields["flops_convention"]
    assert math.isclose(fields["hardware_flops_per_token"], 4800.0)


def test_before_training_a_loss_or_a_framework_makes_evaluation_else_a_probe() -> None:
    model, teacher = nn.Linear(2, 2), nn.Linear(2, 2)
    key, other = between.first_param_id(model), between.first_param_id(teacher)
    pre, evals = PreTraining(), EvalLosses()
    d = StepData(t_start=10.0)
    d.data_wait, d.loader_batches = 0.5, 1  # the first batch, fetched at 10.0
    pre.hold(d, key, 10.5, 11.0, evals.add(None, 1.0))  # probe: 0.5 s
    pre.hold(d, other, 11.0, 11.2, evals.add(None, 1.0))  # a teacher: step 0's
    pre.hold(d, key, 11.2, 12.0, evals.add(torch.tensor(2.0), 4.0))  # evaluation
    note = pre.resolve(d, evals, key)
    # the evaluation is everything since the step opened less the probe: 2.0 - 0.5
    assert d.extra == {"eval_s": pytest.approx(1.5)}
    assert pre.probes == (1, 0.5) and note == {"probe_forwards": 1, "probe_s": 0.5,
                                               "note": PROBE_NOTE}
    assert (d.t_start, d.data_wait, d.loader_batches) == (12.0, 0.0, 0)
    assert evals.take() == (2.0, 1)  # only the evaluation's loss is kept
    assert pre.segments == []


def test_a_probe_alone_leaves_the_first_fetch_in_step_0() -> None:
    model = nn.Linear(2, 2)
    pre = PreTraining()
    d = StepData(t_start=10.0)
    d.data_wait, d.loader_batches = 0.5, 1
    pre.hold(d, between.first_param_id(model), 10.5, 11.5, None)
    pre.resolve(d, EvalLosses(), between.first_param_id(model))
    assert d.extra == {} and pre.probes == (1, 1.0)
    assert (d.t_start, d.data_wait, d.loader_batches) == (11.0, 0.5, 1)


def test_a_framework_evaluation_loop_makes_held_forwards_evaluation() -> None:
    model = nn.Linear(2, 2)
    pre = PreTraining()
    d = StepData(t_start=10.0)
    pre.hold(d, between.first_param_id(model), 10.2, 10.4, None)  # sanity check
    pre.framework_ran()
    assert pre.resolve(d, EvalLosses(), between.first_param_id(model)) is None
    assert d.extra == {"eval_s": pytest.approx(0.4)} and pre.probes == (0, 0.0)
    assert d.t_start == 10.4
