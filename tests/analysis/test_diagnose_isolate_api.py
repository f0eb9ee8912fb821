"""The own-loop isolation API on real PyTorch (CPU): replayed batches, the no-op DDP comm
hook (1-process gloo group), and a recorded verdict that diagnose shows."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from stepscope import Recorder, RunDir  # noqa: E402
from stepscope.analysis.diagnose import diagnose  # noqa: E402
from stepscope.analysis.isolation import data_isolation_verdict  # noqa: E402
from stepscope.errors import ConfigError  # noqa: E402
from stepscope.record.isolate import ReplayBatches, noop_grad_sync_hook, record_isolation  # noqa: E402


def test_replay_batches_repeat_the_first_real_batches() -> None:
    data = torch.utils.data.TensorDataset(torch.arange(40.0).reshape(20, 2))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    replay = ReplayBatches(loader, batches=2)
    got = [b[0][0, 0].item() for b in replay]
    assert len(replay) == 5 and got == [0.0, 8.0, 0.0, 8.0, 0.0]
    assert len(list(ReplayBatches(iter(range(10)), batches=3, steps=7))) == 7
    with pytest.raises(ConfigError):
        ReplayBatches([], batches=2)


def test_noop_hook_keeps_local_gradients() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                         rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        model.register_comm_hook(None, noop_grad_sync_hook)
        x = torch.ones(2, 4)
        model(x).sum().backward()
        assert torch.equal(model.module.weight.grad, torch.full((1, 4), 2.0))
    finally:
        torch.distributed.destroy_process_group()


def _train(run: Path, batches: object, slow: float) -> None:
    """A tiny loop whose data costs ``slow`` seconds per batch (an injected clock)."""
    t = [0.0]
    rec = Recorder(run, clock=lambda: t[0], wall_clock=lambda: 1e9 + t[0], background=False)
    model = torch.nn.Linear(2, 1)
    for (xb,) in rec.wrap_loader(_Slow(batches, slow, t)):
        with rec.step(tokens=float(xb.numel()), samples=float(len(xb))) as s:
            with s.phase("forward"):
                loss = model(xb).pow(2).mean()
                t[0] += 0.01
            s.log(loss=loss.item())
    rec.close()


class _Slow:
    def __init__(self, inner: object, slow: float, t: list[float]) -> None:
        self.inner, self.slow, self.t = inner, slow, t

    def __iter__(self):  # type: ignore[no-untyped-def]
        for b in self.inner:  # type: ignore[attr-defined]
            self.t[0] += self.slow
            yield b


def test_own_loop_data_isolation_is_recorded_and_diagnosed(tmp_path: Path) -> None:
    data = torch.utils.data.TensorDataset(torch.randn(128, 2))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    _train(tmp_path / "base", loader, slow=0.01)
    _train(tmp_path / "replay", ReplayBatches(loader, batches=4), slow=0.0)
    base, _ = RunDir.open(tmp_path / "base").read_steps()
    replay, _ = RunDir.open(tmp_path / "replay").read_steps()
    res = data_isolation_verdict(base, replay)
    # 0.01 s of data per 0.02 s step, gone when replayed: half of the time
    assert res.verdict == "bottleneck" and res.share == pytest.approx(0.5)
    record_isolation(tmp_path / "base", res, tmp_path / "replay")
    run = RunDir.open(tmp_path / "base")
    d = diagnose(base, run.read_meta(), events=run.read_events()[0])
    assert d.bottleneck == "data_pipeline"
    assert any(f.rule == "isolation.data" for f in d.findings)
