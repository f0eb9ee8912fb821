"""The public surface is pinned: `stepscope.__all__` and the CLI's commands and flags.

Scripts and users call these names (DESIGN.md: "add to them freely; do not rename"). A change
here is deliberate: update the pin in the same commit and say why.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click

import stepscope
from stepscope.cli import COMMANDS, _register, cli
from support.traces import cpu_step_events, thread_name, write_trace

PUBLIC = {
    "__version__", "Recorder", "Step", "RunDir", "Run", "open_run", "RunMeta", "StepTable",
    "EventTable",
    "StepscopeError", "RunDirError", "TraceFormatError", "UnknownDeviceError", "ConfigError",
    "Finding", "summarize", "diagnose", "compare_runs", "read_trace", "analyze_trace",
}

# command -> its flags, sorted.
CLI = {
    'alerts': (),
    'alerts flush': ('--alerts', '--json'),
    'alerts test': ('--json',),
    'compare': ('--allow-multi', '--json', '--markdown', '--repeat', '--seed'),
    'demo': ('--framework', '--json', '--out', '--peak-tflops', '--seed', '--slow-data', '--steps'),
    'diagnose': ('--json', '--trace'),
    'eval-log': ('--json', '--metric', '--step', '--tokens'),
    'index': ('--best', '--db', '--engine', '--json', '--markdown', '--scheduler', '--sort',
              '--where'),
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
    'report': ('--flops-convention', '--html', '--json', '--no-html'),
    'run': (   '--alerts',
               '--cross-rank-every',
               '--flops-convention',
               '--grace-s',
               '--json',
               '--max-steps',
               '--metrics-port',
               '--mlflow',
               '--mlflow-experiment',
               '--name',
               '--no-html',
               '--out',
               '--peak-tflops',
               '--profile-steps',
               '--samples-per-step',
               '--tensorboard',
               '--tokens-per-step'),
    'scaling': ('--allow-multi', '--json', '--markdown'),
    'serve': ('--host', '--port'),
    'trace': (),
    'trace diff': ('--by', '--engine', '--hta-compatible', '--json', '--scheduler', '--steps',
                   '--top'),
    'trace show': ('--engine', '--hta-compatible', '--json', '--scheduler', '--steps', '--top'),
    'watch': ('--alerts', '--json', '--poll', '--stall-after'),
}


def test_public_api_is_pinned() -> None:
    assert set(stepscope.__all__) == PUBLIC
    assert len(stepscope.__all__) == len(PUBLIC)
    for name in PUBLIC:
        assert getattr(stepscope, name) is not None


def _imported(code: str, *args: str) -> set[str]:
    """The modules a fresh interpreter has imported after running ``code``."""
    probe = (f"import sys\ntry:\n    {code}\nexcept SystemExit:\n    pass\n"
             "sys.stderr.write('\\nMODULES ' + ' '.join(sorted(sys.modules)) + '\\n')")
    res = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True,
                         text=True, timeout=120)
    line = [x for x in res.stderr.splitlines() if x.startswith("MODULES ")]
    assert line, res.stderr
    return set(line[-1].split()[1:])


def _heavy(mods: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in mods if m.split(".")[0] in names or m in names
                  or any(m.startswith(n + ".") for n in names))


CLI_CALL = "from stepscope.cli import main; sys.argv[0] = 'stepscope'; main()"


def test_import_stepscope_stays_light() -> None:
    """The bootstrap imports stepscope in every training process, and every CLI start
    does: no numpy, no analysis, no torch until a name is used."""
    mods = _imported("import stepscope")
    assert _heavy(mods, ("torch", "mindspore", "matplotlib", "numpy", "rich",
                         "stepscope.analysis", "stepscope.traces",
                         "stepscope.record.recorder", "stepscope.plugs")) == []
    assert stepscope.Recorder.__module__ == "stepscope.record.recorder"  # lazily, on first use


def test_help_imports_no_command() -> None:
    """`stepscope --help` lists every command without importing one (benchmarks/cli_start.py
    measures the start-up this buys)."""
    mods = _imported(CLI_CALL, "--help")
    assert _heavy(mods, ("numpy", "matplotlib", "rich", "torch", "mindspore", "orjson",
                         "stepscope.analysis", "stepscope.rundir.store", "stepscope.calc")) == []
    assert not [m for m in mods if m.startswith("stepscope.cli.")]


def test_trace_imports_only_what_it_uses(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.json", [thread_name(2, "main")] + cpu_step_events())
    mods = _imported(CLI_CALL, "trace", str(trace), "--json")
    assert "stepscope.analysis.trace.breakdown" in mods  # it did run
    assert _heavy(mods, ("matplotlib", "rich", "torch", "mindspore", "stepscope.report",
                         "stepscope.analysis.diagnose", "stepscope.analysis.health.check",
                         "stepscope.analysis.summary", "stepscope.analysis.compare",
                         "stepscope.calc.flops", "stepscope.calc.hardware",
                         "stepscope.calc.memory", "stepscope.calc.plan",
                         "stepscope.record.recorder", "stepscope.rundir.index")) == []
    assert not [m for m in mods if m.startswith("stepscope.cli.") and m not in (
        "stepscope.cli.trace", "stepscope.cli.common")]


def test_help_lines_of_unloaded_commands_match_their_docstrings() -> None:
    """The lazy group's table says what each command's own docstring says."""
    _register()
    assert set(COMMANDS) == set(cli.commands)
    for name, (module, line) in COMMANDS.items():
        cmd = cli.commands[name]
        assert cmd.callback is not None
        assert cmd.callback.__module__ == f"stepscope.cli.{module}"
        for limit in (45, 80, 200):
            assert click.Command(name, help=line).get_short_help_str(limit) == \
                cmd.get_short_help_str(limit), name


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
