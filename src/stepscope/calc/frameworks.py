"""What each training framework accepts, and its launch settings for a layout.

Constraints (each from the framework's own documentation):

* ``megatron`` (Megatron-LM / Megatron-Core): optimizer-state sharding only through its
  distributed optimizer (``--use-distributed-optimizer``, ZeRO-1 equivalent), which combines
  with every parallelism; no ZeRO-2/3. Memory in its own convention (bf16 params, fp32 main
  grads: 18 B/param, 6 + 12/DP with the distributed optimizer). TP inside a node with
  sequence parallelism, CP, EP dividing the experts.
* ``deepspeed``: ZeRO stages 0-3; with pipeline parallelism only stages 0 and 1 (its
  pipeline engine asserts "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism");
  TP through AutoTP inside a node, which trains with ZeRO stages 0-2 (not 3); EP through
  DeepSpeed-MoE; no context parallelism here
  (Ulysses is a different split).
* ``fsdp`` (PyTorch FSDP2 as torchtitan composes it): no sharding (DDP), ZeRO-2
  (``reshard_after_forward=False``) or ZeRO-3 (full sharding); no optimizer-only
  sharding; TP, PP, CP and EP compose with it.
* ``mindspore`` (``set_auto_parallel_context``): the parallel optimizer shards the
  optimizer states (``optimizer_level`` level1), also the gradients (level2), also the
  weights (level3); with pipeline stages only level1 is offered here. TP (model_parallel)
  inside a node; no CP or EP here.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

__all__ = ["FRAMEWORKS", "Framework", "framework", "launch_settings"]


@dataclass(frozen=True)
class Framework:
    name: str
    zeros: tuple[int, ...]  # ZeRO-equivalent stages offered
    zeros_with_pp: tuple[int, ...]
    cp: bool
    ep: bool
    memory_convention: str
    zeros_with_tp: tuple[int, ...] = (0, 1, 2, 3)

    def stages(self, tp: int, pp: int) -> tuple[int, ...]:
        """ZeRO-equivalent stages offered with this TP and PP."""
        return tuple(z for z in self.zeros if (pp == 1 or z in self.zeros_with_pp)
                     and (tp == 1 or z in self.zeros_with_tp))


FRAMEWORKS = {
    "megatron": Framework("megatron", (0, 1), (0, 1), True, True, "megatron"),
    "deepspeed": Framework("deepspeed", (0, 1, 2, 3), (0, 1), False, True, "zero", (0, 1, 2)),
    "fsdp": Framework("fsdp", (0, 2, 3), (0, 2, 3), True, True, "zero"),
    "mindspore": Framework("mindspore", (0, 1, 2, 3), (0, 1), False, False, "zero"),
}


def framework(name: str) -> Framework:
    if name not in FRAMEWORKS:
        raise ConfigError(f"unknown framework {name!r}; expected one of {', '.join(FRAMEWORKS)}")
    return FRAMEWORKS[name]


def launch_settings(fw: str, *, dp: int, tp: int, pp: int, cp: int, ep: int, zero: int,
                    recompute: str, micro_batch: int, global_batch: int, seq_len: int) -> str:
    """Copy-pasteable settings for ``fw``: Megatron flags, a torchtitan TOML fragment, a
    DeepSpeed config, or a MindSpore ``set_auto_parallel_context`` call."""
    lay = _Lay(dp, tp, pp, cp, ep, zero, recompute, micro_batch, global_batch, seq_len)
    return {"megatron": _megatron, "fsdp": _torchtitan, "deepspeed": _deepspeed,
            "mindspore": _mindspore}[fw](lay)


@dataclass(frozen=True)
class _Lay:
    dp: int
    tp: int
    pp: int
    cp: int
    ep: int
    zero: int
    recompute: str
    mb: int
    gb: int
    seq: int

    @property
    def accum(self) -> int:
        return self.gb // (self.dp * self.mb)


def _megatron(x: _Lay) -> str:
    out = (f"--tensor-model-parallel-size {x.tp} --pipeline-model-parallel-size {x.pp} "
           f"--context-parallel-size {x.cp} --expert-model-parallel-size {x.ep} "
           f"--micro-batch-size {x.mb} --global-batch-size {x.gb} --seq-length {x.seq} --bf16")
    if x.tp > 1:
        out += " --sequence-parallel"
    if x.zero == 1:
        out += " --use-distributed-optimizer"
    if x.recompute == "selective":
        out += " --recompute-granularity selective"
    elif x.recompute == "full":
        out += (" --recompute-granularity full --recompute-method uniform "
                "--recompute-num-layers 1")
    return out


def _torchtitan(x: _Lay) -> str:
    shard = x.dp if x.zero else 1
    reshard = '\nfsdp_reshard_after_forward = "never"' if x.zero == 2 else ""
    return (f"[parallelism]\ndata_parallel_replicate_degree = {x.dp // shard}\n"
            f"data_parallel_shard_degree = {shard}\ntensor_parallel_degree = {x.tp}\n"
            f"pipeline_parallel_degree = {x.pp}\ncontext_parallel_degree = {x.cp}\n"
            f"expert_parallel_degree = {x.ep}{reshard}\n[training]\n"
            f"local_batch_size = {x.mb}\nglobal_batch_size = {x.gb}\nseq_len = {x.seq}\n"
            f'[activation_checkpoint]\nmode = "{x.recompute}"')


def _deepspeed(x: _Lay) -> str:
    cfg = (f'{{"train_batch_size": {x.gb}, "train_micro_batch_size_per_gpu": {x.mb}, '
           f'"gradient_accumulation_steps": {x.accum}, "bf16": {{"enabled": true}}, '
           f'"zero_optimization": {{"stage": {x.zero}}}')
    if x.tp > 1:
        cfg += f', "tensor_parallel": {{"autotp_size": {x.tp}}}'
    cfg += "}"
    if x.pp > 1:
        cfg += f"  # + PipelineModule(layers, num_stages={x.pp})"
    if x.ep > 1:
        cfg += f"  # + deepspeed.moe.layer.MoE(..., ep_size={x.ep})"
    return cfg


def _mindspore(x: _Lay) -> str:
    level = {1: "level1", 2: "level2", 3: "level3"}.get(x.zero)
    opt = (f', enable_parallel_optimizer=True, parallel_optimizer_config={{"optimizer_level": '
           f'"{level}"}}' if level else ", enable_parallel_optimizer=False")
    return (f'ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num='
            f"{x.dp * x.tp * x.pp}, pipeline_stages={x.pp}{opt})  # model_parallel={x.tp}, "
            f"micro_batch_num={x.accum}")
