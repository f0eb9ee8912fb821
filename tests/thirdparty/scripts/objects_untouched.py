"""What training scripts do with their own objects after a few steps (third-party fixture):
whole-model ``torch.save`` (word_language_model), ``copy.deepcopy`` of the model (EMA
copies, timm/Lightning), ``pickle`` of model and optimizer, ``state_dict()`` round trips.

Prints one ``SS objects`` line: each operation's outcome (``ok`` or the exception's type)
and what stepscope could have left on the objects (hook counts, attribute names), so a run
under ``stepscope run`` can be compared with a plain run field by field.
"""

import copy
import io
import pickle

import torch
from torch import nn


def say(kind, **kv):
    # the line and its newline in one write: ranks share this stdout, unbuffered under torchrun
    print("SS " + kind + "".join(f" {k}={v!r}" for k, v in kv.items()) + "\n", end="", flush=True)


def outcome(fn):
    try:
        fn()
        return "ok"
    except Exception as exc:
        return type(exc).__name__


torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(32, 16), nn.Linear(16, 32))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
loader = torch.utils.data.DataLoader(torch.randint(0, 32, (16, 9)), batch_size=4)
for batch in loader:
    logits = model(batch[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, 32), batch[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()

ema = None


def deepcopy_model():
    global ema
    ema = copy.deepcopy(model)


def reload_state():
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    fresh = nn.Sequential(nn.Embedding(32, 16), nn.Linear(16, 32))
    fresh.load_state_dict(torch.load(buf))


say("objects",
    torch_save_model=outcome(lambda: torch.save(model, io.BytesIO())),
    deepcopy_model=outcome(deepcopy_model),
    pickle_model=outcome(lambda: pickle.dumps(model)),
    deepcopy_optimizer=outcome(lambda: copy.deepcopy(opt)),
    pickle_optimizer_state=outcome(lambda: pickle.dumps(opt.state_dict())),
    state_dict_round_trip=outcome(reload_state),
    state_dict_keys=sorted(model.state_dict()),
    forward_pre_hooks=len(model._forward_pre_hooks),
    forward_hooks=len(model._forward_hooks),
    module_attrs=sorted(model.__dict__),
    optimizer_attrs=sorted(opt.__dict__),
    ema_equal=ema is not None and all(torch.equal(a, b) for a, b in zip(
        ema.state_dict().values(), model.state_dict().values(), strict=True)))
