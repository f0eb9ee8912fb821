"""`--hf-config`: a model's own config.json gives the numbers of the equivalent shape flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_calc_cli import run, run_json

from stepscope.calc.hf_config import spec_kwargs
from stepscope.calc.model import ModelSpec
from stepscope.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "hf-configs"

# file -> (equivalent shape flags, parameter count transformers reports for the model).
CASES: dict[str, tuple[str, int]] = {
    "llama-2-7b": ("--layers 32 --hidden 4096 --heads 32 --kv-heads 32 --head-dim 128 "
                   "--ffn-hidden 11008 --vocab 32000 --swiglu --seq-len 4096", 6_738_415_616),
    "mistral-7b-v0.1": ("--layers 32 --hidden 4096 --heads 32 --kv-heads 8 --ffn-hidden 14336 "
                        "--vocab 32000 --swiglu --seq-len 32768", 7_241_732_096),
    "mixtral-8x7b-v0.1": ("--layers 32 --hidden 4096 --heads 32 --kv-heads 8 --ffn-hidden 14336 "
                          "--vocab 32000 --swiglu --moe-experts 8 --moe-top-k 2 --seq-len 32768",
                          46_702_792_704),
    "qwen2-7b": ("--layers 28 --hidden 3584 --heads 28 --kv-heads 4 --ffn-hidden 18944 "
                 "--vocab 152064 --swiglu --qkv-bias --seq-len 131072", 7_615_616_512),
    "qwen1.5-moe-a2.7b": ("--layers 24 --hidden 2048 --heads 16 --ffn-hidden 5632 --vocab 151936 "
                          "--swiglu --qkv-bias --moe-experts 60 --moe-top-k 4 --moe-ffn-hidden "
                          "1408 --moe-shared-ffn-hidden 5632 --moe-shared-gate --seq-len 8192",
                          14_315_784_192),
    "qwen3-8b": ("--layers 36 --hidden 4096 --heads 32 --kv-heads 8 --head-dim 128 --ffn-hidden "
                 "12288 --vocab 151936 --swiglu --qk-norm --seq-len 40960", 8_190_735_360),
    "qwen3-30b-a3b": ("--layers 48 --hidden 2048 --heads 32 --kv-heads 4 --head-dim 128 "
                      "--ffn-hidden 6144 --vocab 151936 --swiglu --qk-norm --moe-experts 128 "
                      "--moe-top-k 8 --moe-ffn-hidden 768 --seq-len 40960", 30_532_122_624),
    "deepseek-v2-lite": ("--layers 27 --hidden 2048 --heads 16 --head-dim 128 --ffn-hidden 10944 "
                         "--vocab 102400 --swiglu --kv-lora-rank 512 --qk-rope-head-dim 64 "
                         "--v-head-dim 128 --moe-experts 64 --moe-top-k 6 --moe-ffn-hidden 1408 "
                         "--moe-shared-experts 2 --first-k-dense 1 --seq-len 163840",
                         15_706_484_224),
    # 671,026,419,200 in the checkpoint: + the noaux_tc router's 256 x 58 correction biases.
    "deepseek-v3": ("--layers 61 --hidden 7168 --heads 128 --head-dim 128 --ffn-hidden 18432 "
                    "--vocab 129280 --swiglu --q-lora-rank 1536 --kv-lora-rank 512 "
                    "--qk-rope-head-dim 64 --v-head-dim 128 --moe-experts 256 --moe-top-k 8 "
                    "--moe-ffn-hidden 2048 --moe-shared-ffn-hidden 2048 --first-k-dense 3 "
                    "--seq-len 163840", 671_026_419_200 - 256 * 58),
    "gemma-7b": ("--layers 28 --hidden 3072 --heads 16 --head-dim 256 --ffn-hidden 24576 "
                 "--vocab 256000 --swiglu --tied-embeddings --seq-len 8192", 8_537_680_896),
    "gemma-2-9b": ("--layers 42 --hidden 3584 --heads 16 --kv-heads 8 --head-dim 256 "
                   "--ffn-hidden 14336 --vocab 256000 --swiglu --tied-embeddings "
                   "--norms-per-layer 4 --seq-len 8192", 9_241_705_984),
    "gpt2": ("--layers 12 --hidden 768 --heads 12 --vocab 50257 --tied-embeddings "
             "--position-embeddings 1024 --linear-bias --norm-bias --seq-len 1024", 124_439_808),
    "pythia-160m": ("--layers 12 --hidden 768 --heads 12 --ffn-hidden 3072 --vocab 50304 "
                    "--linear-bias --norm-bias --seq-len 2048", 162_322_944),
}


def _config(name: str) -> dict[str, object]:
    data: dict[str, object] = json.loads((CONFIGS / f"{name}.json").read_text())
    return data


def test_every_family_has_a_case() -> None:
    from stepscope.calc.hf_config import FAMILIES

    types = {str(_config(name)["model_type"]) for name in CASES}
    assert types == set(FAMILIES)
    assert {p.stem for p in CONFIGS.glob("*.json")} == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_param_count_is_the_published_one(name: str) -> None:
    kwargs, used, ignored = spec_kwargs(_config(name))
    spec = ModelSpec(seq_len=1024, **kwargs)
    assert spec.num_params() == CASES[name][1]
    assert used and "model_type" not in ignored and "torch_dtype" not in ignored


@pytest.mark.parametrize("name", sorted(CASES))
def test_hf_config_equals_shape_flags(capsys: pytest.CaptureFixture[str], name: str) -> None:
    flags = CASES[name][0].split()
    path = str(CONFIGS / f"{name}.json")
    a = run_json(capsys, "mfu", "--hf-config", path, "--global-batch", "8")
    b = run_json(capsys, "mfu", *flags, "--global-batch", "8")
    assert a["by_convention"] == b["by_convention"] and a["flops_per_step"] == b["flops_per_step"]
    model = a["model"]
    assert isinstance(model, dict) and model["path"] == path and model["used"]
    layout = ["--dp", "8", "--zero", "1", "--recompute", "selective", "--seq-len", "4096"]
    flags_4k = list(flags)
    flags_4k[flags_4k.index("--seq-len") + 1] = "4096"
    ma = run_json(capsys, "memory", "--hf-config", path, *layout)
    mb = run_json(capsys, "memory", *flags_4k, *layout[:-2])
    keys = ("weights_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes",
            "total_bytes")
    assert [ma[k] for k in keys] == [mb[k] for k in keys]


def test_hf_config_says_what_it_used_and_ignored(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "mfu", "--hf-config", str(CONFIGS / "mistral-7b-v0.1.json"),
                       "--seq-len", "4096")
    assert code == 0
    assert "used " in out and "num_key_value_heads" in out and "sliding_window" in out
    assert "ignored:" in out


def test_unknown_model_type_names_what_is_missing(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mamba", "hidden_size": 768}))
    code, _, err = run(capsys, "mfu", "--hf-config", str(path))
    assert code == 2 and "'mamba' is not supported" in err and "--layers" in err
    bad = dict(_config("llama-2-7b"))
    del bad["intermediate_size"]
    with pytest.raises(ConfigError, match="lacks 'intermediate_size'"):
        spec_kwargs(bad)
    pattern = dict(_config("qwen3-30b-a3b"), decoder_sparse_step=2)
    with pytest.raises(ConfigError, match="decoder_sparse_step=2"):
        spec_kwargs(pattern)


def test_hf_config_refuses_conflicting_shape_flags(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "mfu", "--hf-config", str(CONFIGS / "gpt2.json"),
                       "--heads", "16")
    assert code == 2 and "drop --heads" in err
