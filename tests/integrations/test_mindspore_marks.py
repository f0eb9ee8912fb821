"""Phase windows from the capture's hook marks (pure: exact numbers, no MindSpore run)."""

from __future__ import annotations

from stepscope.integrations.mindspore.marks import windows_from_events


def test_marks_with_backward_hooks_give_forward_loss_backward_optimizer() -> None:
    events = [("forward_begin", 0.0), ("forward_end", 4.0), ("backward_begin", 5.0),
              ("backward_end", 12.0), ("optimizer_begin", 12.5), ("optimizer_end", 14.0)]
    assert windows_from_events(events) == [
        ("forward", 0.0, 4.0), ("loss", 4.0, 5.0), ("backward", 5.0, 12.0),
        ("optimizer", 12.5, 14.0)]


def test_network_with_its_loss_has_no_loss_window() -> None:
    # Model.train: the hooks sit on the network-with-loss; its backward begins at once
    events = [("forward_begin", 0.0), ("forward_end", 4.0), ("backward_begin", 4.0),
              ("backward_end", 9.0), ("optimizer_begin", 9.0), ("optimizer_end", 10.0)]
    assert windows_from_events(events) == [
        ("forward", 0.0, 4.0), ("backward", 4.0, 9.0), ("optimizer", 9.0, 10.0)]


def test_without_backward_hooks_backward_runs_to_the_optimizer() -> None:
    events = [("forward_begin", 1.0), ("forward_end", 3.0), ("optimizer_begin", 8.0),
              ("optimizer_end", 9.0)]
    assert windows_from_events(events) == [
        ("forward", 1.0, 3.0), ("backward", 3.0, 8.0), ("optimizer", 8.0, 9.0)]


def test_accumulation_gives_one_window_set_per_micro_batch() -> None:
    micro = [("forward_begin", 0.0), ("forward_end", 2.0), ("backward_begin", 2.0),
             ("backward_end", 5.0)]
    later = [(n, t + 10.0) for n, t in micro]
    events = micro + later + [("optimizer_begin", 16.0), ("optimizer_end", 17.0)]
    assert windows_from_events(events) == [
        ("forward", 0.0, 2.0), ("backward", 2.0, 5.0), ("forward", 10.0, 12.0),
        ("backward", 12.0, 15.0), ("optimizer", 16.0, 17.0)]


def test_a_forward_without_update_is_forward_only() -> None:
    assert windows_from_events([("forward_begin", 0.0), ("forward_end", 2.0)]) == [
        ("forward", 0.0, 2.0)]
    assert windows_from_events([]) == []


def test_the_capture_takes_its_rank_from_mindspores_own_file_names(shared_data) -> None:  # type: ignore[no-untyped-def]
    from stepscope.integrations.mindspore.profile import _profiler_rank

    ranks = [_profiler_rank(d) for d in
             sorted((shared_data / "traces/mindspore-cpu/dp2_cpu_msrun").glob("*_ascend_ms"))]
    assert ranks == [0, 1]
