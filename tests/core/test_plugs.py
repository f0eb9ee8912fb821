"""The plug board: registered and installed plugs see the records and the run's status;
a plain Recorder imports no plug."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stepscope import Recorder, RunDir
from stepscope.errors import ConfigError
from stepscope.plugs import PlugContext, register_plug, unregister_plug


class Collect:
    """A real plug: keeps what it is given."""

    def __init__(self, ctx: PlugContext) -> None:
        self.rank = ctx.rank
        self.records: list[dict[str, Any]] = []
        self.status: str | None = None

    def on_records(self, records: list[dict[str, Any]]) -> None:
        self.records.extend(records)

    def close(self, status: str) -> None:
        self.status = status


@pytest.fixture
def collected() -> Iterator[list[Collect]]:
    made: list[Collect] = []

    def factory(ctx: PlugContext) -> Collect:
        made.append(Collect(ctx))
        return made[-1]

    register_plug("collect", factory)
    try:
        yield made
    finally:
        unregister_plug("collect")


def test_a_registered_plug_sees_every_record_then_the_status(
        tmp_path: Path, collected: list[Collect]) -> None:
    with pytest.raises(ValueError):
        with Recorder(tmp_path / "run", rank=0) as rec:
            for _ in range(3):
                with rec.step(tokens=8):
                    pass
            raise ValueError("boom")
    [plug] = collected
    assert [r["step"] for r in plug.records] == [0, 1, 2]
    assert plug.status == "failed"
    assert RunDir.open(tmp_path / "run").read_meta().status == "failed"


def test_a_taken_name_and_an_unknown_asked_name_are_errors(tmp_path: Path,
                                                          collected: list[Collect]) -> None:
    with pytest.raises(ConfigError, match="exists already"):
        register_plug("alerts", Collect)
    with pytest.raises(ConfigError, match="neither registered"):
        Recorder(tmp_path / "run", plugs=["no-such-plug"], background=False)


_ENTRY_POINT_CHILD = textwrap.dedent("""
    import sys
    from stepscope import Recorder
    rec = Recorder(sys.argv[1], background=False)
    with rec.step():
        pass
    rec.close()
""")


def test_an_installed_plug_starts_when_asked_for_by_name(tmp_path: Path) -> None:
    # A real installed distribution: a module and its dist-info with the entry point.
    site = tmp_path / "site"
    site.mkdir()
    (site / "myplug.py").write_text(textwrap.dedent("""
        class Plug:
            def __init__(self, ctx):
                self.path = ctx.run.path / "myplug.txt"
            def on_records(self, records):
                with open(self.path, "a") as f:
                    f.write(f"{len(records)} records\\n")
            def close(self, status):
                with open(self.path, "a") as f:
                    f.write(status + "\\n")
    """))
    info = site / "myplug-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: myplug\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[stepscope.plugs]\nmine = myplug:Plug\n")
    env_path = f"{site}:{Path(__file__).resolve().parents[2] / 'src'}"
    env = {**os.environ, "PYTHONPATH": env_path, "STEPSCOPE_PLUGS": "mine"}
    res = subprocess.run([sys.executable, "-c", _ENTRY_POINT_CHILD, str(tmp_path / "run")],
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "run" / "myplug.txt").read_text() == "1 records\nfinished\n"


def test_a_plain_recorder_imports_no_plug(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import sys
        from stepscope import Recorder
        Recorder({str(tmp_path / 'run')!r}, background=False).close()
        print(' '.join(sorted(sys.modules)))
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={k: v for k, v in os.environ.items()
                                           if not k.startswith("STEPSCOPE_")})
    assert res.returncode == 0, res.stderr
    mods = set(res.stdout.split())
    assert "stepscope.plugs" in mods
    assert not [m for m in mods if m.startswith(("stepscope.alerts", "stepscope.report",
                                                 "stepscope.analysis", "importlib.metadata"))]
