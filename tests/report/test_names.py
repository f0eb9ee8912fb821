"""Op names in narrow columns: shortened where needed, never cut blindly."""

from __future__ import annotations

from stepscope.analysis.op_findings import op_family, op_findings
from stepscope.report.names import fit_name, fit_names, name_width


def test_names_that_fit_are_untouched() -> None:
    assert fit_names(["aten::mm", "aten::addmm"], 24) == ["aten::mm", "aten::addmm"]


def test_a_shared_path_prefix_gives_way_first() -> None:
    names = ["Gradients/Default/network-WithLossCell/_backbone-GPT/MatMul-op123",
             "Gradients/Default/network-WithLossCell/_backbone-GPT/Softmax-op7"]
    assert fit_names(names, 24) == ["…/MatMul-op123", "…/Softmax-op7"]


def test_the_middle_of_a_long_name_gives_way_keeping_both_ends() -> None:
    name = "void cutlass::Kernel<cutlass_80_tensorop_bf16_s16816gemm_relu_256x128_32x3_nn>"
    short = fit_name(name, 30)
    assert len(short) == 30 and short.startswith("void cutl") and short.endswith("32x3_nn>")
    assert "…" in short


def test_the_column_widens_with_the_terminal() -> None:
    assert name_width(80, 66) == 24 and name_width(200, 66) == 134


def test_an_op_family_over_a_fifth_of_op_time_is_a_named_finding() -> None:
    report = {"top_ops": [
        {"name": "aten::bernoulli_", "share_pct": 27.6},
        {"name": "aten::mm", "share_pct": 15.0}, {"name": "aten::addmm", "share_pct": 10.0},
        {"name": "aten::gelu", "share_pct": 5.0}]}
    found = {f.evidence["family"]: f for f in op_findings(report)}
    assert set(found) == {"dropout", "matmul"}  # matmul: 15 + 10 = 25%
    assert found["dropout"].severity == "warning"
    assert found["dropout"].message == ("trace: dropout ops take 27.6% of op time "
                                        "(aten::bernoulli_ 27.6%)")
    assert found["matmul"].severity == "info"
    assert op_family("Gradients/Default/MatMul-op1") == "matmul"
