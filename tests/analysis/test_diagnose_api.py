"""diagnose(), isolation verdicts, advice and trace findings on hand-built inputs."""

from __future__ import annotations

import numpy as np
import pytest

from stepscope.analysis.advice import STAGES, advise
from stepscope.analysis.diagnose import diagnose, trace_findings
from stepscope.analysis.health import HealthConfig
from stepscope.analysis.isolation import (
    IsolationResult,
    comm_isolation_verdict,
    data_isolation_verdict,
    isolation_finding,
)
from stepscope.findings import Finding
from stepscope.schema import RunMeta, StepTable

N = 40


def _run(step_s: float, data_s: float = 0.0, tokens: float = 1000.0, ranks: int = 1,
         **cols: np.ndarray) -> StepTable:
    """``ranks`` ranks of N steps of ``step_s`` seconds (step 0: 1 s warm-up), falling loss."""
    s = np.tile(np.arange(N), ranks)
    st = np.full(N * ranks, step_s)
    st[s == 0] = 1.0
    data = {"rank": np.repeat(np.arange(ranks), N), "step": s, "step_time_s": st,
            "end_s": np.concatenate([np.cumsum(st[s.size // ranks * r:][:N])
                                     for r in range(ranks)]),
            "tokens": np.full(N * ranks, tokens), "data_wait_s": np.full(N * ranks, data_s),
            "loss": 3.0 - s / N, "lr": np.full(N * ranks, 1e-3)}
    data.update(cols)
    return StepTable.from_columns(data)


def test_data_isolation_field_report_numbers() -> None:
    # 1000 tokens per 1.25 s = 800 tokens/s as is; 1050 tokens/s replayed (field report)
    res = data_isolation_verdict(_run(1.25, data_s=0.3), _run(1000 / 1050))
    assert res.baseline_rate == pytest.approx(800.0)
    assert res.experiment_rate == pytest.approx(1050.0)
    assert res.share == pytest.approx(1 - 800 / 1050)
    assert (res.verdict, res.unit, res.baseline_measured_frac) == ("bottleneck", "tokens/s",
                                                                   pytest.approx(0.24))
    assert res.valid_training_run and not res.load_adjusted
    assert res.to_dict()["verdict"] == "bottleneck"
    assert IsolationResult.from_dict(res.to_dict()) == res


def test_isolation_not_bottleneck_minor_and_inconclusive() -> None:
    assert data_isolation_verdict(_run(0.1), _run(0.1)).verdict == "not_bottleneck"
    minor = data_isolation_verdict(_run(0.1), _run(0.092))  # 8% faster replayed
    assert minor.verdict == "minor" and "not the bottleneck" in minor.message
    short = data_isolation_verdict(_run(0.1).select(np.arange(3)), _run(0.1))
    assert short.verdict == "inconclusive"


def test_isolation_is_load_adjusted_when_phases_exist() -> None:
    # the experiment ran on a host twice as slow: compute doubled, data wait vanished
    fw = np.full(N, 0.05)
    base = _run(0.1, data_s=0.02, forward_s=fw, backward_s=fw * 0.5, optimizer_s=fw * 0.1)
    exp = _run(0.16, forward_s=fw * 2, backward_s=fw, optimizer_s=fw * 0.2)
    res = data_isolation_verdict(base, exp)
    # outside compute: 0.1 - 0.08 = 0.02 as is, 0.16 - 0.16 = 0 replayed -> 20% of 0.1 s
    assert res.load_adjusted and res.share == pytest.approx(0.2)
    # ... but a host that doubled the untouched forward phase is an uncontrolled
    # experiment: inconclusive, with the number
    assert res.compute_change == pytest.approx(1.0) and res.verdict == "inconclusive"
    assert "forward phase, which the experiment does not touch, ran +100%" in res.message


def test_isolation_with_a_steady_host_is_a_verdict_in_readable_numbers() -> None:
    fw = np.full(N, 0.05)
    base = _run(0.1, data_s=0.02, tokens=2000.0, forward_s=fw, backward_s=fw * 0.5,
                optimizer_s=fw * 0.1)
    exp = _run(0.08, tokens=2000.0, forward_s=fw * 1.05, backward_s=fw * 0.5,
               optimizer_s=fw * 0.1)
    res = data_isolation_verdict(base, exp)
    assert res.verdict == "bottleneck"
    assert res.message.startswith("20,000 -> 25,000 tokens/s with replayed in-memory batches")


def test_comm_isolation_without_gradient_sync_has_nothing_to_remove() -> None:
    res = comm_isolation_verdict(_run(0.1), _run(0.1))
    assert res.verdict == "nothing_to_remove"
    assert "no gradient synchronisation" in res.message


def test_comm_isolation_is_marked_not_a_valid_run() -> None:
    res = comm_isolation_verdict(_run(0.2, comm_s=np.full(N, 0.08)), _run(0.12))
    assert (res.kind, res.verdict, res.valid_training_run) == ("comm", "bottleneck", False)
    assert "not a valid training run" in res.message
    f = isolation_finding(res)
    assert (f.category, f.severity, f.rule) == ("communication", "warning", "isolation.comm")


def test_diagnose_contract_and_bottleneck() -> None:
    d = diagnose(_run(0.1, data_s=0.03))
    assert set(d.to_dict()) == {"bottleneck", "findings"}
    assert d.bottleneck == "data_pipeline"
    assert d.to_dict()["findings"][0]["category"] == "data_pipeline"
    assert [a.stage for a in d.advice] == ["data", "data"]
    healthy = diagnose(_run(0.1))
    assert healthy.bottleneck is None
    assert all(f.severity == "info" for f in healthy.findings)


def test_isolation_event_confirms_or_clears_the_data_suspect() -> None:
    table = _run(0.1, data_s=0.03)
    cleared = data_isolation_verdict(_run(0.1), _run(0.1))
    d = diagnose(table, events=[{"type": "isolation", "kind": "data",
                                 "result": cleared.to_dict()}])
    assert d.bottleneck is None
    wait = next(f for f in d.findings if f.rule == "health.data_wait")
    assert wait.severity == "info" and "isolation" in wait.evidence["explained_by"]


def test_proved_data_suspect_points_at_the_experiment_not_at_running_it() -> None:
    table = _run(0.1, data_s=0.03)
    proved = data_isolation_verdict(table, _run(0.07))
    assert proved.verdict == "bottleneck"
    d = diagnose(table, events=[{"type": "isolation", "kind": "data",
                                 "result": proved.to_dict()}])
    assert d.bottleneck == "data_pipeline"
    wait = next(f for f in d.findings if f.rule == "health.data_wait")
    assert wait.severity == "warning" and wait.evidence["proved_by"] == "isolation experiment"
    assert wait.recommendation.startswith("Proved by the isolation experiment (30%")
    assert "stepscope isolate" not in wait.recommendation


def test_straggler_explains_comm_and_nan_explains_later_spikes() -> None:
    comm = np.concatenate([np.full(N, 0.06), np.full(N, 0.001)])
    fw = np.concatenate([np.full(N, 0.02), np.full(N, 0.08)])
    d = diagnose(_run(0.1, ranks=2, comm_s=comm, forward_s=fw))
    assert d.bottleneck == "straggler"
    assert [(f.category, f.severity, f.rank) for f in d.findings][:2] == [
        ("straggler", "warning", 1), ("communication", "info", None)]
    loss = 3.0 - np.arange(N) / N
    loss[30:] = np.nan
    d = diagnose(_run(0.1, loss=loss))
    assert [(f.category, f.severity, f.steps) for f in d.findings
            if f.severity != "info"] == [("numerics", "critical", (30, 39))]


def test_integration_findings_from_events() -> None:
    ev = {"type": "finding", "category": "logging", "severity": "warning",
          "message": "no data wait recorded: no DataLoader", "rule": "integrations.torch_auto",
          "steps": None, "rank": 0}
    d = diagnose(_run(0.1), events=[ev, {"type": "eval", "step": 3}])
    (f,) = [f for f in d.findings if f.rule == "integrations.torch_auto"]
    assert f.severity == "info"  # the loss is recorded: only an optional column is missing
    no_loss = _run(0.1, loss=np.full(N, np.nan))
    d = diagnose(no_loss, events=[ev])
    assert {(f.category, f.severity) for f in d.findings} >= {("logging", "warning")}


def test_cross_rank_events_used_without_per_rank_records() -> None:
    ev = [{"type": "cross_rank", "stragglers": [3]}] * 3
    d = diagnose(_run(0.1), events=ev)
    (f,) = [f for f in d.findings if f.category == "straggler"]
    assert (f.rank, f.rule) == (3, "events.cross_rank")


def test_cross_rank_scores_are_judged_by_the_one_threshold() -> None:
    # recorded with the old 0.7 threshold: rank 1 (0.75) was not listed; 0.75 < 0.8 is
    scores = {"0": 1.0, "1": 0.75, "2": 0.95}
    ev = [{"type": "cross_rank", "straggler_scores": scores, "stragglers": [],
           "threshold": 0.7}] * 2
    (f,) = [f for f in diagnose(_run(0.1), events=ev).findings if f.category == "straggler"]
    assert (f.rank, f.evidence) == (1, {"gathers": 2, "flagged": 2})
    lenient = HealthConfig(straggler_score=0.7)
    assert not [f for f in diagnose(_run(0.1), events=ev, config=lenient).findings
                if f.category == "straggler"]


def test_trace_findings_from_a_report_dict() -> None:
    report = {"ranks": {"0": {"view": "accelerator", "idle_pct": 45.0, "window_us": 1000.0,
                              "comm_us": 500.0, "comm_overlap_us": 100.0,
                              "comm_comp_overlap_pct": 20.0},
                        "1": {"view": "host", "idle_pct": 90.0}},
              "comparison": {"slower_by_pct": 40.0, "straggler_rank": 1,
                             "straggler_score": 0.7, "differing_phase": "forward",
                             "phase_delta_us": 5.0}}
    got = [(f.category, f.rank, f.rule) for f in trace_findings(report)]
    assert got == [("compute", 0, "trace.idle"), ("communication", 0, "trace.comm"),
                   ("straggler", 1, "trace.ranks")]
    comm = trace_findings(report)[1]
    assert comm.evidence["exposed_comm_pct"] == pytest.approx(40.0)
    # the one straggler threshold (HealthConfig.straggler_score = 0.8) decides, not the
    # step-time gap: a rank 40% slower per step that works only 18% longer is no straggler
    report["comparison"]["straggler_score"] = 0.85
    assert [f.category for f in trace_findings(report)] == ["compute", "communication"]
    strict = HealthConfig(straggler_score=0.9)
    assert [f.category for f in trace_findings(report, strict)][-1] == "straggler"


def test_trace_findings_on_a_real_trace(shared_data) -> None:  # type: ignore[no-untyped-def]
    from stepscope.analysis.trace.breakdown import analyze
    from stepscope.traces import read_trace

    report = analyze(read_trace(shared_data / "traces" / "kineto-cpu" / "ddp2_gloo_basic"))
    d = diagnose(_run(0.1), trace_report=report.to_dict())
    assert set(d.to_dict()) == {"bottleneck", "findings"}


def test_advice_is_framework_specific_in_payoff_order() -> None:
    fs = [Finding("loss_scale", "warning", "x"), Finding("communication", "warning", "y"),
          Finding("data_pipeline", "warning", "z"), Finding("memory", "info", "ignored")]
    torch_adv = advise(fs, RunMeta("r", environment={"framework": "torch"}))
    stages = [a.stage for a in torch_adv]
    assert stages == sorted(stages, key=STAGES.index)
    assert stages[0] == "data" and stages[-1] == "precision"
    assert any("bucket_cap_mb" in a.knob for a in torch_adv)
    assert any(a.caution and "LR" in a.caution for a in torch_adv)  # no_sync raises batch
    ms = advise(fs, RunMeta("r", environment={"framework": "mindspore"}))
    assert any("DynamicLossScaleManager" in a.knob for a in ms)
    assert all(a.framework == "mindspore" for a in ms)


def test_memory_advice_quotes_the_calculators_zero_numbers() -> None:
    # ZeRO paper, Fig. 1: 7.5B params, 64 GPUs: 120 GB unsharded (111.8 GiB), ZeRO-3
    # 1.875 GB (1.7 GiB) per GPU, as stepscope.calc.memory computes them
    adv = advise([Finding("memory", "warning", "creep")],
                 RunMeta("r", baseline={"num_params": 7.5e9, "dp": 64}))
    (zero,) = [a for a in adv if "ZeRO" in a.knob]
    assert ("model states ~111.8 GiB/device unsharded vs ~1.7 GiB with ZeRO-3 over dp=64 "
            "(stepscope.calc.memory)") in zero.expected_effect
