"""A MindSpore ``Model.train`` whose callback ends a forked helper with SIGTERM (fixture).

What a MindSpore dataset worker sees at shutdown, in small: after step 2 a forked
``multiprocessing.Process`` is started and ended by ``terminate()`` (SIGTERM); training
goes on. Run plain it exits 0 after printing ``HELPER ENDED -15`` and ``TRAINED <steps>``.
"""

import multiprocessing
import time

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.train import Callback, Model

STEPS = 12


class EndHelper(Callback):
    def __init__(self) -> None:
        self.steps = 0

    def on_train_step_end(self, run_context):  # noqa: ARG002 (MindSpore's signature)
        self.steps += 1
        if self.steps == 2:
            proc = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
            proc.start()
            proc.terminate()
            proc.join()
            print(f"HELPER ENDED {proc.exitcode}", flush=True)  # -15: died of SIGTERM


def data():
    rng = np.random.default_rng(0)
    for _ in range(STEPS):
        yield rng.standard_normal((4, 8)).astype(np.float32), \
            rng.standard_normal((4, 2)).astype(np.float32)


ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")
net = nn.Dense(8, 2)
model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.01))
cb = EndHelper()
model.train(1, ms.dataset.GeneratorDataset(data, ["x", "y"]), callbacks=[cb],
            dataset_sink_mode=False)
print(f"TRAINED {cb.steps}", flush=True)
