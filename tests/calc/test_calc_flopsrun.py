"""FLOPs per token of a recorded run under each named convention (calc/flopsrun.py)."""

from __future__ import annotations

import pytest

from stepscope.calc import flopsrun


def test_run_flops_by_convention_reproduces_nanogpt_estimate_mfu() -> None:
    from stepscope.errors import ConfigError

    shape = {"layers": 2, "heads": 2, "hidden": 32, "vocab": 64, "position_params": 16 * 32}
    table = flopsrun.by_convention(num_params=27520 + 512, lookups=512, seq_len=16,
                                   shape=shape)
    # nanoGPT estimate_mfu: 6 * get_num_params() + 12 * L * H * Q * T
    assert table["palm"]["flops_per_token"] == 6 * 27520 + 12 * 2 * 2 * 16 * 16
    assert table["matmul"]["flops_per_token"] == 6 * 27520
    assert flopsrun.choose(table, "6n")["flops_per_token"] == 6 * 27520
    only = flopsrun.by_convention(num_params=1000, lookups=0, seq_len=None, shape=None)
    assert list(only) == ["matmul"]
    with pytest.raises(ConfigError, match="available: matmul"):
        flopsrun.choose(only, "palm")


def test_the_old_adapter_import_path_is_the_calc_module() -> None:
    import stepscope  # noqa: F401  (installs the finder of moved modules)
    from stepscope.integrations.torch import flopsrun as old

    assert old is flopsrun and old.six_n_matmul(10, 2)["flops_per_token"] == 48.0
