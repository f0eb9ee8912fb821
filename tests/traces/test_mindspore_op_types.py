"""Op types beside MindSpore's scoped names, and `trace diff` matching a PyNative and a
graph-mode profile of the same CNN by op type (real MindSpore 2.10 CPU captures in
tests/data, read without MindSpore)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from rich.console import Console

from stepscope.analysis.trace.breakdown import analyze
from stepscope.analysis.trace.diff import diff_reports
from stepscope.cli import cli
from stepscope.report.trace_view import render_trace_report
from stepscope.traces import read_trace
from stepscope.traces.mindspore_phases import op_type

DATA = Path(__file__).resolve().parents[1] / "data"
PYNATIVE = DATA / "mindspore-pynative-cnn-marks"
GRAPH = DATA / "mindspore-graph-cnn-jit"


def test_op_type_is_the_primitive_of_a_scoped_name() -> None:
    assert op_type("Gradients/Default/network-WithLossCell/_backbone-Net/conv2-Conv2d/"
                   "Conv2DBackpropFilter-op1") == "Conv2DBackpropFilter"
    assert op_type("Default/Conv2D-op0") == "Conv2D"
    assert op_type("MatMul") == "MatMul"


def test_every_op_row_carries_its_type() -> None:
    rep = analyze(read_trace(GRAPH))
    rows = {o.name: o.op_type for o in rep.all_ops}
    filters = [n for n, t in rows.items() if t == "Conv2DBackpropFilter"]
    assert len(filters) == 2  # one per conv layer, each under its own name
    assert all(n.endswith(("Conv2DBackpropFilter-op0", "Conv2DBackpropFilter-op1"))
               for n in filters)
    assert all(o["op_type"] for o in rep.to_dict()["top_ops"])


def test_terminal_shows_the_type_even_when_the_name_is_cut() -> None:
    rep = analyze(read_trace(GRAPH))
    console = Console(width=110, record=True, color_system=None)
    render_trace_report(console, rep, top=10)
    text = console.export_text()
    top = rep.top_ops[:10]
    assert "Conv2DBackpropFilter" in {o.op_type for o in top}
    for o in top:
        assert o.op_type in text, o.op_type
    assert any(o.name not in text for o in top)  # some names had to be cut to fit


def test_diff_of_pynative_and_graph_matches_ops_by_type() -> None:
    a, b = analyze(read_trace(PYNATIVE)), analyze(read_trace(GRAPH))
    d = diff_reports(a, b, limit=200)
    assert d.matched_by == "type"
    status = {o.name: o.status for o in d.ops}
    for t in ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "MatMul", "SGD"):
        assert status[t] in ("slower", "faster", "same"), (t, status[t])
    # summed per type: both convs' filter gradients in one row on each side
    a_filter = sum(o.total_us for o in a.all_ops if o.op_type == "Conv2DBackpropFilter")
    row = next(o for o in d.ops if o.name == "Conv2DBackpropFilter")
    assert abs(row.a_us_per_step * d.a_steps - a_filter) < 1e-6
    by_name = diff_reports(a, b, limit=200, by="name")
    assert by_name.matched_by == "name"
    # by name most ops of one mode are missing from the other
    one_sided = [o for o in by_name.ops if o.status in ("added", "removed")]
    assert len(one_sided) > 2 * sum(o.status in ("added", "removed") for o in d.ops)
    assert any(o.name.startswith("Gradients/") and o.status == "added" for o in one_sided)


def test_trace_diff_cli_says_what_it_matched_by() -> None:
    res = CliRunner().invoke(cli, ["trace", "diff", str(PYNATIVE), str(GRAPH), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["matched_by"] == "type"
    assert "Conv2DBackpropFilter" in {o["name"] for o in doc["ops"]}
    res = CliRunner().invoke(cli, ["trace", "diff", str(PYNATIVE), str(GRAPH), "--by", "name",
                                   "--json"])
    assert json.loads(res.output)["matched_by"] == "name"
