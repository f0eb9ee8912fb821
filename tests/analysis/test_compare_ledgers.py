"""A/B verdicts on real runs: tiny torch models trained on the CPU (see support.compare_runs).

One set of runs is trained once for the module: a baseline, the same configuration again
(noise), a run with a starving loader (slowed), the global batch raised 16 -> 64 (one
variable, the classic LR trap) and the global batch raised together with a new seed (two
variables).
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from stepscope.analysis.compare.runs import JSON_KEYS, Comparison, compare_runs
from stepscope.cli import main
from stepscope.rundir.run import Run
from support.compare_runs import Spec, train_interleaved

pytestmark = pytest.mark.xdist_group("compare_torch_runs")
STEPS = 50


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    specs = [Spec("base"), Spec("repeat"), Spec("slow", slow_s=0.004),
             Spec("batch64", batch=64), Spec("two", batch=64, seed=1)]
    return train_interleaved(tmp_path_factory.mktemp("ab"), specs, STEPS)


def _compare(a: Path, b: Path, seed: int = 0) -> Comparison:
    ra, rb = Run.open(a), Run.open(b)
    return compare_runs(ra.read()[0], ra.meta, rb.read()[0], rb.meta, ra.events("eval"),
                        rb.events("eval"), seed=seed)


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The real entry point in-process: (exit status, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out, out.err


def test_same_config_twice_is_no_significant_difference(
        runs: dict[str, Path], tmp_path: Path) -> None:
    """An A/A pair: no significant difference. The speed verdict is a 95% interval, so an
    A/A pair is called faster or slower about one time in twenty by design (more when a
    neighbour's load lands on one run's steps). The module's pair cannot be rerun, so one
    fresh pair is trained when it is; two independent misses in a row are a bug."""
    r = _compare(runs["base"], runs["repeat"])
    if r.speed.verdict != "no significant difference":
        first = r.speed.reason
        again = train_interleaved(tmp_path, [Spec("base"), Spec("repeat")], STEPS)
        r = _compare(again["base"], again["repeat"])
        assert r.speed.verdict == "no significant difference", (first, r.speed.reason)
    assert r.differing == []
    assert r.speed.verdict == "no significant difference"
    assert r.speed.primary == "tokens_per_s"
    # Same seed, same data: the loss curves are identical, so quality holds exactly.
    loss = r.quality.metrics["train_loss"]
    assert (loss.diff, loss.verdict, r.quality.verdict) == (0.0, "holds", "holds")
    assert r.verdict == "not landed"


def test_slowed_run_is_slower(runs: dict[str, Path]) -> None:
    r = _compare(runs["base"], runs["slow"])
    assert r.differing == []
    assert r.speed.verdict == "slower"
    m = r.speed.metrics
    assert m["tokens_per_s"].change == "worse" and m["tokens_per_s"].ci_rel[1] < 0
    assert m["step_time_s"].change == "worse"
    assert m["data_wait_frac"].change == "worse"  # the loader is what got slow
    assert r.verdict == "not landed"


def test_removing_the_slowdown_lands(runs: dict[str, Path]) -> None:
    r = _compare(runs["slow"], runs["base"])
    assert (r.speed.verdict, r.quality.verdict, r.verdict) == ("faster", "holds", "landed")


def test_one_variable_flags_the_batch_trap(runs: dict[str, Path]) -> None:
    r = _compare(runs["base"], runs["batch64"])
    assert [str(d) for d in r.independent] == ["global_batch 16\u219264"]
    micro = next(d for d in r.differing if d.variable == "micro_batch")
    assert micro.derived_from == "global_batch"
    trap = r.differing[0].warning
    assert trap is not None and "lr not scaled" in trap and "4x" in trap
    assert r.quality.warnings == [trap]
    if r.verdict == "inconclusive":
        # The pair trained while other tests loaded the host: the conditions ledger says
        # so (a fresh-clone CI run met it); the trap above is what this test is about.
        assert any("conditions differ" in x for x in r.reasons), r.reasons
    else:
        assert r.verdict in ("landed", "not landed")
    # Losses are matched on tokens (the big batch took 4x fewer steps per token).
    assert "tokens" in r.quality.metrics["train_loss"].at


def test_two_variables_are_invalid(runs: dict[str, Path]) -> None:
    r = _compare(runs["base"], runs["two"])
    assert [d.variable for d in r.independent] == ["global_batch", "seed"]
    assert r.verdict == "invalid"
    assert r.reasons[0].startswith("2 variables differ: global_batch 16\u219264, seed 0\u21921")
    assert r.speed.metrics["tokens_per_s"].a is not None  # ledgers are still computed


def test_json_keys_and_reproducible_bootstrap(runs: dict[str, Path]) -> None:
    d1 = _compare(runs["base"], runs["repeat"], seed=7).to_dict()
    d2 = _compare(runs["base"], runs["repeat"], seed=7).to_dict()
    assert tuple(d1) == JSON_KEYS
    assert d1 == d2
    # (the A/A speed verdict itself, with its one retry, is test_same_config_twice_...)
    assert d1["speed"]["verdict"] in ("no significant difference", "faster", "slower")
    assert d1["quality"]["verdict"] == "holds"
    assert set(d1["speed"]["tokens_per_s"]) >= {"a", "b", "diff", "ci", "ci_rel", "change"}


def test_cli_compare_exit_codes_and_json(capsys: pytest.CaptureFixture[str],
                                         runs: dict[str, Path]) -> None:
    base, two, slow = str(runs["base"]), str(runs["two"]), str(runs["slow"])
    code, out, _ = run_cli(capsys, "compare", base, two, "--json")
    assert code == 1
    assert orjson.loads(out)["verdict"] == "invalid"
    assert run_cli(capsys, "compare", base, two, "--allow-multi")[0] == 0
    code, out, _ = run_cli(capsys, "compare", base, slow)
    assert code == 0 and "Speed ledger — slower" in out and "step time" in out
    code, out, _ = run_cli(capsys, "compare", base, slow, "--markdown")
    assert out.splitlines()[0] == "| config | step time (s) | comm share | tokens/s | MFU |"
    code, _, err = run_cli(capsys, "compare", base, str(runs["base"].parent / "nope"))
    assert code == 2 and err.startswith("stepscope: error:") and "does not exist" in err
    # --repeat: the same configuration run again measures run-to-run noise ...
    code, out, _ = run_cli(capsys, "compare", base, slow, "--repeat", str(runs["repeat"]),
                           "--json")
    assert (code, orjson.loads(out)["speed"]["verdict"]) == (0, "slower")
    # ... and a run of another configuration is refused as a repeat.
    code, _, err = run_cli(capsys, "compare", base, slow, "--repeat", two)
    assert code == 2 and "is not a repeat of" in err


def test_eval_log_feeds_the_quality_ledger(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                           runs: dict[str, Path]) -> None:
    import shutil

    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(runs["slow"], a)
    shutil.copytree(runs["base"], b)
    assert run_cli(capsys, "eval-log", str(a), "--step", "49", "--metric", "val_loss=2.50",
                   "--metric", "val_acc=0.40")[0] == 0
    code, out, _ = run_cli(capsys, "eval-log", str(b), "--step", "49", "--metric",
                           "val_loss=2.60", "--metric", "val_acc=0.41", "--json")
    assert code == 0
    assert orjson.loads(out) == {"type": "eval", "step": 49,
                                 "metrics": {"val_loss": 2.6, "val_acc": 0.41}}
    r = _compare(a, b)
    q = r.quality.metrics
    assert (q["eval:val_loss"].verdict, q["eval:val_acc"].verdict) == ("regressed", "holds")
    assert r.speed.verdict == "faster"
    assert r.verdict == "not landed"  # faster, but validation loss regressed
    code, _, err = run_cli(capsys, "eval-log", str(b), "--step", "3", "--metric", "val_loss")
    assert code == 2 and "expected NAME=NUMBER" in err
