"""`stepscope alerts test FILE`: each sink's outcome, exit 0 only if all accepted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.chat_robots import DING_SECRET, FEISHU_SECRET, ChatRobots


def _file(tmp_path: Path, robots: ChatRobots, ding_secret_env: str) -> Path:
    text = f"""
[[sink]]
type = "console"
[[sink]]
type = "wecom"
url = "{robots.url('wecom')}"
[[sink]]
type = "dingtalk"
url_env = "T_DING_URL"
secret_env = "{ding_secret_env}"
keyword = "stepscope"
[[sink]]
type = "feishu"
url = "{robots.url('feishu')}"
secret_file = "{tmp_path / 'feishu.secret'}"
[[sink]]
type = "slack"
url = "{robots.url('slack')}"
[[sink]]
type = "webhook"
name = "pager"
url = "{robots.url('webhook')}"
"""
    (tmp_path / "feishu.secret").write_text(FEISHU_SECRET)
    p = tmp_path / "alerts.toml"
    p.write_text(text)
    return p


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stepscope", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **env})


def test_every_sink_accepts_the_test_message(tmp_path: Path, robots: ChatRobots) -> None:
    env = {"T_DING_URL": robots.url("dingtalk"), "T_DING_SECRET": DING_SECRET}
    proc = _run(["alerts", "test", str(_file(tmp_path, robots, "T_DING_SECRET"))], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["console#1", "wecom#2", "dingtalk#3",
                                                  "feishu#4", "slack#5", "pager"]
    assert all(": accepted" in ln for ln in lines)
    assert sorted(r.platform for r in robots.state.accepted) == [
        "dingtalk", "feishu", "slack", "webhook", "wecom"]
    assert "test message" in proc.stderr  # the console sink's red line
    assert DING_SECRET not in proc.stdout + proc.stderr


def test_one_refusing_sink_makes_the_exit_status_1(tmp_path: Path, robots: ChatRobots) -> None:
    env = {"T_DING_URL": robots.url("dingtalk"), "T_BAD": "SECnot-the-secret"}
    proc = _run(["alerts", "test", str(_file(tmp_path, robots, "T_BAD"))], env)
    assert proc.returncode == 1
    ding = [ln for ln in proc.stdout.splitlines() if ln.startswith("dingtalk#3")]
    assert ding and "310000" in ding[0]
    assert "SECnot-the-secret" not in proc.stdout + proc.stderr


def test_a_bad_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    p = tmp_path / "alerts.toml"
    p.write_text("[[sink]]\ntype = 'wecom'\nurl_env = 'T_UNSET_VAR'\n")
    proc = _run(["alerts", "test", str(p)], {})
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "T_UNSET_VAR" in proc.stderr


def test_flush_of_a_missing_run_or_a_bad_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE_")}
    bad = tmp_path / "bad.toml"
    bad.write_text("[[sink]]\ntype = \"pager\"\n")
    for args in (["alerts", "flush", str(tmp_path / "nope")],
                 ["alerts", "flush", str(tmp_path), "--alerts", str(bad)]):
        proc = subprocess.run([sys.executable, "-m", "stepscope", *args], capture_output=True,
                              text=True, timeout=60, env=env)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stdout == ""
