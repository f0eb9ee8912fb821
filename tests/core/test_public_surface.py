"""The public surface is pinned: `stepscope.__all__` and the CLI's commands and flags.

Scripts and users call these names (DESIGN.md: "add to them freely; do not rename"). A change
here is deliberate: update the pin in the same commit and say why.
"""

from __future__ import annotations

import subprocess
import sys

import click

import stepscope
from stepscope.cli import _register, cli

PUBLIC = {
    "__version__", "Recorder", "Step", "RunDir", "RunMeta", "StepTable", "EventTable",
    "StepscopeError", "RunDirError", "TraceFormatError", "UnknownDeviceError", "ConfigError",
    "Finding", "summarize", "diagnose", "compare_runs", "read_trace", "analyze_trace",
}

# command -> its flags, sorted.
CLI = {
    'compare': ('--allow-multi', '--json', '--markdown', '--repeat', '--seed'),
    'demo': ('--framework', '--json', '--out', '--seed', '--slow-data', '--steps'),
    'diagnose': ('--json', '--trace'),
    'eval-log': ('--json', '--metric', '--step', '--tokens'),
    'index': ('--best', '--db', '--json', '--markdown', '--sort', '--where'),
    'isolate': ('--json', '--out', '--steps', '--warmup'),
    'memory': (   '--attention-scores',
                 '--convention',
                 '--cp',
                 '--dp',
                 '--ep',
                 '--etp',
                 '--ffn-hidden',
                 '--first-k-dense',
                 '--flash-attention',
                 '--gpus-per-node',
                 '--grad-dtype',
                 '--head-dim',
                 '--heads',
                 '--hf-config',
                 '--hidden',
                 '--json',
                 '--kv-heads',
                 '--kv-lora-rank',
                 '--largest-layer-params',
                 '--layers',
                 '--linear-bias',
                 '--micro-batch',
                 '--moe-experts',
                 '--moe-ffn-hidden',
                 '--moe-shared-experts',
                 '--moe-shared-ffn-hidden',
                 '--moe-shared-gate',
                 '--moe-top-k',
                 '--mtp-layers',
                 '--norm-bias',
                 '--norms-per-layer',
                 '--num-microbatches',
                 '--offload',
                 '--optimizer',
                 '--params',
                 '--position-embeddings',
                 '--pp',
                 '--precision',
                 '--q-lora-rank',
                 '--qk-norm',
                 '--qk-rope-head-dim',
                 '--qkv-bias',
                 '--recompute',
                 '--seq-len',
                 '--sequence-parallel',
                 '--swiglu',
                 '--tied-embeddings',
                 '--tp',
                 '--v-head-dim',
                 '--virtual-stages',
                 '--vocab',
                 '--vocab-divisor',
                 '--zero'),
    'mfu': (   '--causal',
              '--convention',
              '--cores',
              '--cpu-clock-ghz',
              '--device',
              '--devices',
              '--dtype',
              '--ffn-hidden',
              '--first-k-dense',
              '--global-batch',
              '--head-dim',
              '--heads',
              '--hf-config',
              '--hidden',
              '--json',
              '--kv-heads',
              '--kv-lora-rank',
              '--layers',
              '--linear-bias',
              '--moe-experts',
              '--moe-ffn-hidden',
              '--moe-shared-experts',
              '--moe-shared-ffn-hidden',
              '--moe-shared-gate',
              '--moe-top-k',
              '--mtp-layers',
              '--norm-bias',
              '--norms-per-layer',
              '--params',
              '--peak-tflops',
              '--position-embeddings',
              '--q-lora-rank',
              '--qk-norm',
              '--qk-rope-head-dim',
              '--qkv-bias',
              '--recompute',
              '--recompute-fraction',
              '--seq-len',
              '--step-time',
              '--swiglu',
              '--tied-embeddings',
              '--tokens-per-s',
              '--tp',
              '--v-head-dim',
              '--vocab',
              '--vocab-divisor'),
    'plan': (   '--attention-scores',
               '--compute-efficiency',
               '--device',
               '--device-memory-gb',
               '--devices',
               '--devices-per-node',
               '--dtype',
               '--ffn-hidden',
               '--first-k-dense',
               '--flash-attention',
               '--framework',
               '--global-batch',
               '--grad-dtype',
               '--head-dim',
               '--headroom',
               '--heads',
               '--hf-config',
               '--hidden',
               '--inter-node-gbps',
               '--intra-node-gbps',
               '--json',
               '--kv-heads',
               '--kv-lora-rank',
               '--layers',
               '--limit',
               '--linear-bias',
               '--max-micro-batch',
               '--moe-experts',
               '--moe-ffn-hidden',
               '--moe-shared-experts',
               '--moe-shared-ffn-hidden',
               '--moe-shared-gate',
               '--moe-top-k',
               '--mtp-layers',
               '--norm-bias',
               '--norms-per-layer',
               '--optimizer',
               '--params',
               '--peak-tflops',
               '--position-embeddings',
               '--precision',
               '--q-lora-rank',
               '--qk-norm',
               '--qk-rope-head-dim',
               '--qkv-bias',
               '--seq-len',
               '--swiglu',
               '--tied-embeddings',
               '--v-head-dim',
               '--vocab',
               '--vocab-divisor'),
    'export': ('--experiment', '--json', '--to'),
    'report': ('--html', '--json', '--no-html'),
    'run': (   '--cross-rank-every',
               '--json',
               '--max-steps',
               '--name',
               '--out',
               '--profile-steps',
               '--samples-per-step',
               '--tokens-per-step'),
    'scaling': ('--allow-multi', '--json', '--markdown'),
    'serve': ('--host', '--port'),
    'trace': (),
    'trace diff': ('--hta-compatible', '--json', '--steps', '--top'),
    'trace show': ('--hta-compatible', '--json', '--steps', '--top'),
}


def test_public_api_is_pinned() -> None:
    assert set(stepscope.__all__) == PUBLIC
    assert len(stepscope.__all__) == len(PUBLIC)
    for name in PUBLIC:
        assert getattr(stepscope, name) is not None


def test_import_stepscope_stays_light() -> None:
    """The bootstrap imports stepscope in every training process: no analysis, no torch."""
    code = ("import sys, stepscope; heavy = [m for m in ('torch', 'mindspore', 'matplotlib', "
            "'stepscope.analysis.diagnose', 'stepscope.traces') if m in sys.modules]; "
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout.strip()
    assert out == "[]"


def _surface(group: click.Group, prefix: str = "") -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for name, cmd in sorted(group.commands.items()):
        key = f"{prefix}{name}"
        if isinstance(cmd, click.Group):
            out.update(_surface(cmd, key + " "))
        out[key] = tuple(sorted(o for p in cmd.params for o in getattr(p, "opts", [])
                                if o.startswith("-")))
    return out


def test_cli_commands_and_flags_are_pinned() -> None:
    _register()
    assert _surface(cli) == CLI


def test_contract_commands_exist() -> None:
    """The commands DESIGN.md fixes, with their --json."""
    _register()
    surface = _surface(cli)
    for cmd in ("demo", "report", "mfu", "memory", "plan", "trace show", "run", "diagnose",
                "compare", "index"):
        assert cmd in surface
    for cmd in ("report", "mfu", "memory", "plan", "trace show", "diagnose", "compare",
                "index"):
        assert "--json" in surface[cmd]
