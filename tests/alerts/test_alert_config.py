"""The alert file: a good one loads with secrets resolved; each mistake is one line naming
the key; secrets never show in a repr."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepscope.alerts import AlertConfigError, load_alerts_config
from stepscope.alerts.config import RulesConfig

GOOD = """
[rules]
step_time_factor = 3.0
consecutive = 4
stall_after_s = 120
min_tokens_per_s_frac = 0.4
data_wait_frac = 0.3
disable = ["loss_spike"]

[[sink]]
type = "console"

[[sink]]
type = "dingtalk"
name = "oncall"
url_env = "TEST_DING_URL"
secret_env = "TEST_DING_SECRET"
keyword = "stepscope"
min_severity = "critical"
mention = ["13800000000", "@all"]
msgtype = "markdown"

[[sink]]
type = "feishu"
url = "https://open.feishu.cn/open-apis/bot/v2/hook/abc"
secret_file = "SECRET_PATH"
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "alerts.toml"
    p.write_text(text)
    return p


def test_good_file_resolves_rules_and_secrets_from_env_and_file(tmp_path: Path) -> None:
    secret = tmp_path / "feishu.secret"
    secret.write_text("fs-secret\n")
    path = _write(tmp_path, GOOD.replace("SECRET_PATH", str(secret)))
    env = {"TEST_DING_URL": "https://oapi.dingtalk.com/robot/send?access_token=tok-9f3e",
           "TEST_DING_SECRET": "SECabc"}
    cfg = load_alerts_config(path, env=env)
    assert cfg.rules == RulesConfig(step_time_factor=3.0, consecutive=4, stall_after_s=120.0,
                                    min_tokens_per_s_frac=0.4, data_wait_frac=0.3,
                                    disable=("loss_spike",))
    assert [s.name for s in cfg.sinks] == ["console#1", "oncall", "feishu#3"]
    ding = cfg.sinks[1]
    assert (ding.url, ding.secret, ding.min_severity) == (env["TEST_DING_URL"], "SECabc",
                                                          "critical")
    assert ding.mention == ("13800000000", "@all") and ding.msgtype == "markdown"
    assert cfg.sinks[2].secret == "fs-secret"
    shown = repr(cfg)
    assert "tok-9f3e" not in shown and "SECabc" not in shown and "fs-secret" not in shown


@pytest.mark.parametrize("text, key", [
    ("[rules]\nstep_time_factr = 2\n", "'step_time_factr'"),
    ("[rules]\nconsecutive = 2.5\n", "'consecutive'"),
    ("[rules]\nstall_after_s = -1\n", "'stall_after_s'"),
    ("[rules]\nstep_time_factor = 0.5\n", "'step_time_factor'"),
    ("[rules]\ndisable = ['nope']\n", "'disable'"),
    ("[[sink]]\ntype = 'teams'\nurl = 'https://x'\n", "'type'"),
    ("[[sink]]\ntype = 'wecom'\n", "'url'"),
    ("[[sink]]\ntype = 'wecom'\nurl_env = 'NOT_SET_ANYWHERE'\n", "NOT_SET_ANYWHERE"),
    ("[[sink]]\ntype = 'slack'\nurl = 'https://x'\nsecret = 's'\n", "'secret'"),
    ("[[sink]]\ntype = 'wecom'\nurl = 'https://x'\nmin_severity = 'loud'\n", "'min_severity'"),
    ("[[sink]]\ntype = 'slack'\nurl = 'https://x'\nmsgtype = 'markdown'\n", "'msgtype'"),
    ("[[sink]]\ntype = 'wecom'\nurl = 'ftp://x'\n", "'url'"),
    ("[[sink]]\ntype = 'wecom'\nurl = 'https://x'\nurl_env = 'X'\n", "url, url_env"),
    ("[[sink]]\ntype = 'wecom'\nurl = 'https://x'\ncolour = 'red'\n", "'colour'"),
    ("[alerts]\n", "'alerts'"),
    ("[rules\n", "not valid TOML"),
])
def test_each_mistake_is_one_line_naming_the_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(AlertConfigError) as info:
        load_alerts_config(_write(tmp_path, text), env={})
    message = str(info.value)
    assert key in message and "\n" not in message and str(tmp_path) in message


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(AlertConfigError, match="cannot read"):
        load_alerts_config(tmp_path / "absent.toml", env={})


def test_two_sinks_with_one_name_are_refused(tmp_path: Path) -> None:
    text = "[[sink]]\ntype='console'\nname='a'\n[[sink]]\ntype='console'\nname='a'\n"
    with pytest.raises(AlertConfigError, match="two sinks are named 'a'"):
        load_alerts_config(_write(tmp_path, text), env={})


def test_baseline_run_is_read_when_the_file_is_loaded(tmp_path: Path) -> None:
    from stepscope.rundir.store import RunDir, StepFileWriter
    from stepscope.schema import RunMeta

    base = RunDir.create(tmp_path / "base", RunMeta(run_id="base"))
    StepFileWriter(base.steps_path(0)).write(
        [{"rank": 0, "step": i, "step_time_s": 0.2, "tokens": 1000.0} for i in range(30)])
    cfg = load_alerts_config(_write(tmp_path, f"[rules]\nbaseline_run = '{base.path}'\n"),
                             env={})
    assert cfg.rules.baseline_step_time_s == 0.2
    assert cfg.rules.baseline_tokens_per_s == pytest.approx(5000.0)
    with pytest.raises(AlertConfigError, match="'baseline_run'"):
        load_alerts_config(_write(tmp_path, f"[rules]\nbaseline_run = '{tmp_path}/nope'\n"),
                           env={})
