"""Evaluation losses into the run's eval events: what a forward's loss is, how one
evaluation's forwards are averaged, which of a Trainer's metrics are quality."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from stepscope.integrations import evals  # noqa: E402
from stepscope.integrations.torch import evalloss  # noqa: E402


def test_forward_loss_is_the_outputs_one_scalar() -> None:
    logits, loss = torch.zeros(2, 3), torch.tensor(1.5)
    assert evalloss.forward_loss((logits, loss)) is loss  # nanoGPT / minGPT
    assert evalloss.forward_loss((logits, None)) is None  # generate(): no targets
    assert evalloss.forward_loss({"loss": loss, "logits": logits}) is loss
    assert evalloss.forward_loss(loss) is loss
    assert evalloss.forward_loss(logits) is None
    assert evalloss.forward_loss((logits, (torch.zeros(1), torch.zeros(1)))) is None  # LSTM
    assert evalloss.forward_loss((torch.tensor(1.0), torch.tensor(2.0))) is None  # which?
    transformers = pytest.importorskip("transformers")
    out = transformers.modeling_outputs.CausalLMOutput(loss=loss, logits=logits)
    assert evalloss.forward_loss(out) is loss


def test_evaluation_loss_is_the_token_weighted_mean_of_its_forwards() -> None:
    ev = evalloss.EvalLosses()
    ev.add(torch.tensor(2.0), evalloss.weight_of(48.0, 4.0))
    ev.add(torch.tensor(4.0), evalloss.weight_of(16.0, 4.0))  # a shorter last batch
    ev.add(None, 1.0)  # a forward without a loss is left out
    assert ev.take() == ((2.0 * 48 + 4.0 * 16) / 64, 2)
    assert ev.take() is None  # taken: the next evaluation starts empty
    assert evalloss.weight_of(math.nan, 3.0) == 3.0 and evalloss.weight_of(math.nan,
                                                                           math.nan) == 1.0


def test_a_loss_module_after_the_forward_gives_its_loss() -> None:
    ev = evalloss.EvalLosses()
    ev.add(None, 10.0)
    assert ev.awaiting()
    ev.set_last(torch.nn.NLLLoss()(torch.log_softmax(torch.zeros(2, 4), 1),
                                   torch.tensor([0, 1])))
    assert not ev.awaiting()
    mean, n = ev.take() or (None, 0)
    assert n == 1 and mean == pytest.approx(math.log(4))
    assert evalloss.is_loss_module(torch.nn.CrossEntropyLoss(), torch)
    assert not evalloss.is_loss_module(torch.nn.Linear(2, 2), torch)


def test_the_collector_stands_down_once_a_framework_reports() -> None:
    ev = evalloss.EvalLosses()
    ev.framework = True
    ev.add(torch.tensor(1.0), 1.0)
    assert ev.take() is None


def test_trainer_metrics_without_its_timing_keys() -> None:
    metrics = {"eval_loss": 2.5, "eval_accuracy": 0.25, "eval_runtime": 0.4,
               "eval_samples_per_second": 80.0, "eval_steps_per_second": 20.0,
               "epoch": 1.0, "eval_model_preparation_time": 0.01, "eval_text": "x"}
    assert evals.hf_metrics(metrics) == {"eval_loss": 2.5, "eval_accuracy": 0.25}
    assert evals.hf_metrics(None) == {}
    assert evals.scalar_metrics({"val_loss": torch.tensor(1.25), "v": torch.zeros(2),
                                 "nan": math.nan}) == {"val_loss": 1.25}


def test_eval_event_is_the_quality_ledgers_record() -> None:
    assert evals.eval_event(3, {}, "x") is None
    assert evals.eval_event(3, {"eval_loss": 2.0}, "Trainer on_evaluate") == {
        "type": "eval", "step": 3, "metrics": {"eval_loss": 2.0},
        "source": "Trainer on_evaluate"}
