"""The ``STEPSCOPE_PROFILE_STEPS`` window of the zero-code instrumentation: a
``torch.profiler`` capture of steps [start, stop), its trace saved per rank."""

from __future__ import annotations

import os
from typing import Any

from .state import AutoState


def _profiler_step(st: AutoState, n: int) -> None:
    """Profile steps [start, stop): ``n`` steps are complete, so step ``n`` begins now."""
    window = st.settings.profile_steps
    if window is None or not st.settings.profile_dir:
        return
    start, stop = window
    prof = st.profiler
    if prof is None and n == start:
        st.profiler = _start_profiler(st, start, stop)
    elif prof is not None:
        prof.step()  # closes ProfilerStep#(n-1); at n == stop the schedule saves the trace
        if n >= stop:
            stop_profiler(st)


def _start_profiler(st: AutoState, start: int, stop: int) -> Any:
    torch = st.torch
    prof_mod = torch.profiler
    acts = [prof_mod.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(prof_mod.ProfilerActivity.CUDA)
    action = prof_mod.ProfilerAction
    path = os.path.join(st.settings.profile_dir, f"rank-{st.rank:05d}.pt.trace.json")

    def schedule(step: int) -> Any:  # a schedule makes the profiler mark ProfilerStep#N
        if step < stop - 1:
            return action.RECORD
        return action.RECORD_AND_SAVE if step == stop - 1 else action.NONE

    prof = prof_mod.profile(activities=acts, schedule=schedule, record_shapes=False,
                            on_trace_ready=lambda p: p.export_chrome_trace(path))
    prof.step_num = start  # ProfilerStep#<n> then matches the step table's index
    prof.start()
    return prof


def stop_profiler(st: AutoState) -> None:
    """Stop a capture still running (run ended early); the trace is saved on stop."""
    prof = st.profiler
    if prof is None:
        return
    st.profiler = None
    st.marks.close_all()  # a phase still open (the run ended inside it) ends here
    try:
        prof.stop()
    except Exception as exc:
        st.failed("profiler export", exc)
