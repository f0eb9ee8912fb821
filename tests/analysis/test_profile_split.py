"""The report's phase split from an archived profile (hand-made trace report, exact)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from stepscope.analysis.profile_split import profile_phase_split, with_profile_split
from stepscope.analysis.summary import summarize
from stepscope.schema import StepTable


def _step(**us: float) -> dict[str, float]:
    row = {f"{k}_us": v for k, v in us.items()}
    row["step_time_us"] = sum(us.values())
    return row


REPORT = {"ranks": {"0": {"steps": [_step(data=10, forward=30, backward=50, optimizer=5,
                                          other=3, idle=2),
                                    _step(data=0, forward=40, backward=50, optimizer=5,
                                          other=5, idle=0)]}}}


def _sheet(phases: dict[str, float]):  # type: ignore[no-untyped-def]
    cols = {"rank": np.zeros(4), "step": np.arange(4.0), "step_time_s": np.ones(4),
            **{f"{k}_s": np.full(4, v) for k, v in phases.items()}}
    return summarize(StepTable.from_columns(cols))


def test_profile_split_is_the_share_of_summed_step_time() -> None:
    frac, n, ranks = profile_phase_split(REPORT)
    assert (n, ranks) == (2, 1)
    assert frac == {"data_wait": 10 / 200, "forward": 70 / 200, "backward": 100 / 200,
                    "optimizer": 10 / 200, "other": 10 / 200}


def test_sheet_takes_the_profile_split_when_records_name_too_little() -> None:
    sheet = _sheet({"data_wait": 0.001})
    assert sheet.phase_frac["other"] > 0.99  # the field report's "other 99.9%"
    out = with_profile_split(sheet, {"report": REPORT, "profile_dir": "20261201T120000Z"})
    assert out.phase_frac["backward"] == 0.5
    assert out.phase_source == ("profile 20261201T120000Z: 2 profiled steps on 1 rank (the "
                                "step records name 0% of the step; profiled steps carry the "
                                "profiler's overhead)")
    assert replace(out, phase_frac=sheet.phase_frac, phase_source=sheet.phase_source) == sheet


def test_recorded_phases_win_when_they_cover_the_step() -> None:
    sheet = _sheet({"forward": 0.3, "backward": 0.5})
    assert with_profile_split(sheet, {"report": REPORT}) is sheet
    assert with_profile_split(_sheet({}), None).phase_frac == _sheet({}).phase_frac
    assert with_profile_split(_sheet({}), {"status": "not analysed"}) == _sheet({})
