"""Lightning Trainer with StepscopeCallback: a tiny next-token model on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from stepscope.integrations.lightning import StepscopeCallback  # noqa: E402
from stepscope.rundir.store import RunDir  # noqa: E402

VOCAB, SEQ = 64, 16


class _TinyLM(pl.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 32), torch.nn.Linear(32, VOCAB))
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x).reshape(-1, VOCAB), y.reshape(-1))
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


@pytest.mark.xdist_group("lightning")
def test_lightning_callback_rows(tmp_path):
    pl.seed_everything(5, verbose=False)
    data = torch.randint(0, VOCAB, (64, SEQ + 1))
    ds = torch.utils.data.TensorDataset(data[:, :-1], data[:, 1:])
    loader = torch.utils.data.DataLoader(ds, batch_size=4)
    model = _TinyLM()
    run_dir = tmp_path / "run"
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=4, accumulate_grad_batches=2,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False,
                         callbacks=[StepscopeCallback(run_dir)])
    trainer.fit(model, loader)

    table, stats = RunDir(run_dir).read_steps()
    assert stats.skipped == 0
    assert table["step"].tolist() == [0, 1, 2, 3]
    assert table["tokens"].tolist() == [2 * 4 * SEQ] * 4  # two micro-batches of 4 x 16
    assert table["samples"].tolist() == [8.0] * 4
    # Lightning divides each micro-batch loss by 2 before backward: the step's sum is the mean
    expected = [(a + b) / 2 for a, b in zip(model.losses[0::2], model.losses[1::2],
                                            strict=True)]
    assert np.allclose(table["loss"], expected, rtol=1e-5)
    assert table["lr"].tolist() == [0.1] * 4
    for col in ("step_time_s", "data_wait_s", "forward_s", "backward_s", "optimizer_s",
                "grad_norm"):
        assert np.isfinite(table[col]).all() and (table[col] >= 0).all(), col
    meta = RunDir(run_dir).read_meta()
    assert meta.status == "finished"
    b = meta.baseline
    assert b["num_params"] == 64 * 32 + 32 * 64 + 64
    assert (b["grad_accum"], b["precision"], b["seed"]) == (2, "fp32", 5)
    assert b["optimizer"] == "SGD" and b["optimizer_hparams"]["momentum"] == 0.9


@pytest.mark.xdist_group("lightning")
def test_unmodified_lightning_under_stepscope_run(tmp_path):
    from support.torch_run import python_script, stepscope_run

    out = tmp_path / "auto"
    proc = stepscope_run(out, *python_script("torch_lightning.py"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    micro = [float(line.split()[1]) for line in proc.stdout.splitlines()
             if line.startswith("MICRO ")]
    assert len(micro) == 8
    table, _ = RunDir(out).read_steps()
    assert table["step"].tolist() == [0, 1, 2, 3]
    assert table["tokens"].tolist() == [2 * 4 * SEQ] * 4
    assert table["micro_batches"].tolist() == [2.0] * 4
    # backward runs on loss / 2 (accumulate_grad_batches): the step's loss is their mean
    expected = [(a + b) / 2 for a, b in zip(micro[0::2], micro[1::2], strict=True)]
    assert np.allclose(table["loss"], expected, rtol=1e-5)
    assert table["lr"].tolist() == [0.1] * 4
    meta = RunDir(out).read_meta()
    assert meta.baseline["grad_accum"] == 2 and meta.baseline["seed"] == 5
    assert meta.config["instrumentation"] == "auto"


class _ValLM(_TinyLM):
    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(
            self.net(x).reshape(-1, VOCAB), y.reshape(-1)))


@pytest.mark.xdist_group("lightning")
def test_two_fits_one_run_steps_numbered_on_val_loss_recorded(tmp_path):
    pl.seed_everything(5, verbose=False)
    data = torch.randint(0, VOCAB, (16, SEQ + 1))
    ds = torch.utils.data.TensorDataset(data[:, :-1], data[:, 1:])
    loader = torch.utils.data.DataLoader(ds, batch_size=4)
    model = _ValLM()
    run_dir = tmp_path / "run"
    cb = StepscopeCallback(run_dir)
    hooks_before = (len(torch.nn.modules.module._global_forward_pre_hooks),
                    len(torch.nn.modules.module._global_forward_hooks))
    val = []
    for _ in range(2):
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, callbacks=[cb])
        trainer.fit(model, loader, loader)
        val.append(float(trainer.callback_metrics["val_loss"]))

    table, _ = RunDir(run_dir).read_steps()
    assert table["step"].tolist() == list(range(8))  # 4 per fit, numbered on
    assert table["tokens"].tolist() == [4.0 * SEQ] * 8
    assert np.allclose(table["loss"], model.losses, rtol=1e-6)
    evals = [(e["step"], e["metrics"]) for e in RunDir(run_dir).read_events("eval")[0]]
    assert evals == [(4, {"val_loss": val[0]}), (8, {"val_loss": val[1]})]  # no sanity
    assert (len(torch.nn.modules.module._global_forward_pre_hooks),
            len(torch.nn.modules.module._global_forward_hooks)) == hooks_before


class _SlowValLM(_TinyLM):
    """Validation that takes a known time (a sleep per batch, timed by the module)."""

    def __init__(self) -> None:
        super().__init__()
        self.val_s: list[float] = []
        self._t0 = 0.0

    def on_validation_epoch_start(self) -> None:
        import time
        self._t0 = time.perf_counter()

    def validation_step(self, batch, batch_idx):
        import time
        time.sleep(0.05)
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x).reshape(-1, VOCAB), y.reshape(-1))

    def on_validation_epoch_end(self) -> None:
        import time
        self.val_s.append(time.perf_counter() - self._t0)


@pytest.mark.xdist_group("lightning")
def test_validation_between_steps_is_eval_time_not_data_wait(tmp_path):
    """A validation after step 2 (val_check_interval=2) is step 2's eval_s and not its data
    wait; the sanity check before training is no step's."""
    pl.seed_everything(5, verbose=False)
    data = torch.randint(0, VOCAB, (32, SEQ + 1))
    ds = torch.utils.data.TensorDataset(data[:, :-1], data[:, 1:])
    loader = torch.utils.data.DataLoader(ds, batch_size=4)
    val = torch.utils.data.DataLoader(ds, batch_size=8)  # 4 batches: >= 0.2 s
    model = _SlowValLM()
    run_dir = tmp_path / "run"
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=4, val_check_interval=2,
                         num_sanity_val_steps=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[StepscopeCallback(run_dir)])
    trainer.fit(model, loader, val)

    table, _ = RunDir(run_dir).read_steps()
    assert table["step"].tolist() == [0, 1, 2, 3]
    sanity, after_2 = model.val_s[0], model.val_s[1]
    eval_s, wait = np.nan_to_num(table["eval_s"]), table["data_wait_s"]
    assert 0.9 * after_2 < eval_s[2] < after_2 + 0.05, (eval_s.tolist(), model.val_s)
    assert wait[2] < 0.5 * after_2, (wait.tolist(), model.val_s)
    assert eval_s[[0, 1, 3]].tolist() == [0.0, 0.0, 0.0]  # the sanity check is no step's
    assert sanity > 0
