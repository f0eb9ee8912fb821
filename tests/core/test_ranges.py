"""The one ``a:b`` step-range parser: both ends included, open sides, one-line errors."""

from __future__ import annotations

import pytest

from stepscope._ranges import StepRange, StepRangeError, parse_step_range
from stepscope.errors import ConfigError


def test_both_ends_are_included_and_a_side_may_be_open() -> None:
    assert parse_step_range("10:12") == StepRange(10, 12)
    assert [s for s in range(20) if s in StepRange(10, 12)] == [10, 11, 12]
    assert parse_step_range("7") == StepRange(7, 7)
    assert parse_step_range(" 3: ") == StepRange(3, None)
    assert parse_step_range(":5") == StepRange(None, 5)
    assert [s for s in range(8) if s in StepRange(None, 5)] == [0, 1, 2, 3, 4, 5]
    assert parse_step_range(None) is None and parse_step_range("  ") is None


def test_closed_ranges_need_both_ends_from_step_zero() -> None:
    assert parse_step_range("5:8", closed=True) == StepRange(5, 8)
    for bad in ("3:", ":5", "-1:2"):
        with pytest.raises(StepRangeError, match="both ends are needed"):
            parse_step_range(bad, "--profile-steps", closed=True)


@pytest.mark.parametrize("spec,why", [("x:y", "'x' is not a step number"),
                                      ("1:2:3", "expected 'a:b'"),
                                      ("5:2", "2 is before 5")])
def test_errors_are_one_line_config_errors_naming_the_flag(spec: str, why: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_step_range(spec, "--steps")
    msg = str(info.value)
    assert msg.startswith(f"--steps {spec!r}: expected 'a:b'") and why in msg
    assert "\n" not in msg
    assert isinstance(info.value, ValueError)  # callers that caught ValueError still do
