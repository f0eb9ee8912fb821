"""A real Prometheus server (Debian's `prometheus`) scrapes a rank's /metrics and its HTTP
API returns the step-time series with the run and rank labels."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from stepscope.alerts.model import Alert

prom_client = pytest.importorskip("prometheus_client", reason="prometheus-client not installed")
PROMETHEUS = shutil.which("prometheus")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _query(port: int, q: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            doc = json.loads(r.read())
    except OSError:
        return []
    return list(doc.get("data", {}).get("result", []))


def test_exporter_serves_the_last_steps_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    from stepscope.alerts.metrics import MetricsExporter

    monkeypatch.setenv("STEPSCOPE_METRICS_ADDR", "127.0.0.1")
    ex = MetricsExporter(_free_port(), "exp1", rank=0, flops=lambda: (6e9, 1e12))
    try:
        ex.on_records([{"rank": 0, "step": 0, "step_time_s": 0.5, "tokens": 1000.0,
                        "data_wait_s": 0.1, "loss": 2.5}, {"rank": 0, "step": 0, "loss": 2.4}])
        ex.on_alert(Alert("stall", "critical", "exp1", 0, 0, "m", "n", "s"))
        with urllib.request.urlopen(f"http://127.0.0.1:{ex.port}/metrics", timeout=5) as r:
            text = r.read().decode()
    finally:
        ex.close()
    labels = '{rank="0",run="exp1"}'
    assert f"stepscope_step_time_seconds{labels} 0.5" in text
    assert f"stepscope_tokens_per_second{labels} 2000.0" in text
    assert f"stepscope_mfu{labels} 12.0" in text  # 2000 tok/s x 6 GFLOP / 1 TFLOP/s
    assert f"stepscope_data_wait_share{labels} 0.2" in text
    assert f"stepscope_loss{labels} 2.4" in text
    assert f"stepscope_steps_total{labels} 1.0" in text
    assert 'stepscope_alerts_total{rank="0",rule="stall",run="exp1"} 1.0' in text


@pytest.mark.slow
@pytest.mark.skipif(PROMETHEUS is None, reason="the prometheus server is not installed "
                    "(Debian package `prometheus`)")
def test_prometheus_scrapes_the_step_time_series(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from stepscope.alerts.metrics import MetricsExporter

    monkeypatch.setenv("STEPSCOPE_METRICS_ADDR", "127.0.0.1")
    ex = MetricsExporter(_free_port(), "exp1", rank=0, local_rank=0)
    stop = threading.Event()

    def feed() -> None:
        step = 0
        while not stop.wait(0.2):
            ex.on_records([{"rank": 0, "step": step, "step_time_s": 0.25, "tokens": 512.0}])
            step += 1

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    api = _free_port()
    (tmp_path / "prom.yml").write_text(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: stepscope\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{ex.port}']\n")
    proc = subprocess.Popen(
        [str(PROMETHEUS), f"--config.file={tmp_path / 'prom.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{api}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        result: list[dict[str, Any]] = []
        deadline = time.monotonic() + 60
        while not result and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            result = _query(api, "stepscope_step_time_seconds")
        if proc.poll() is not None and not result:
            pytest.skip(f"prometheus did not start: {proc.stderr.read()[-300:]!r}"
                        if proc.stderr else "prometheus did not start")
        assert result, "prometheus never scraped the exporter"
        [series] = result
        assert series["metric"]["run"] == "exp1" and series["metric"]["rank"] == "0"
        assert float(series["value"][1]) == 0.25
        ranged = _query(api, "stepscope_step_time_seconds[30s]")
        assert ranged and len(ranged[0]["values"]) >= 1
    finally:
        stop.set()
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        ex.close()


def test_grafana_dashboard_queries_only_exported_metrics() -> None:
    import re

    from stepscope.alerts import metrics

    path = Path(metrics.__file__).parent / "grafana" / "stepscope.json"
    dash = json.loads(path.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"stepscope_[a-z_]+", e)}
    exported = {f"stepscope_{n}" for n in metrics._GAUGES} | {"stepscope_alerts_total"}
    assert used == exported


def test_recorder_metrics_port_serves_its_steps(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import stepscope

    monkeypatch.setenv("STEPSCOPE_METRICS_ADDR", "127.0.0.1")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    port = _free_port()
    rec = stepscope.Recorder(tmp_path / "run", meta={"name": "exp9"}, metrics_port=port)
    try:
        for _ in range(3):
            with rec.step(tokens=256) as s:
                s.log(loss=1.5)
        rec.flush()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    finally:
        rec.close()
    assert 'stepscope_steps_total{rank="0",run="exp9"} 3.0' in text
    assert 'stepscope_loss{rank="0",run="exp9"} 1.5' in text


def _listening(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp writes them) listening on ``port``."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, _, p = local.partition(":")
            if state == "0A" and int(p, 16) == port:  # 0A: LISTEN
                out.add(addr)
    return out


def test_metrics_port_listens_on_loopback_by_default_and_says_where(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Before: --metrics-port served every interface (0.0.0.0) without a word."""
    import stepscope

    monkeypatch.delenv("STEPSCOPE_METRICS_ADDR", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    port = _free_port()
    rec = stepscope.Recorder(tmp_path / "run", meta={"name": "exp9"}, metrics_port=port)
    try:
        assert _listening(port) == {"0100007F"}  # 127.0.0.1 only
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            assert r.status == 200
    finally:
        rec.close()
    assert f"at http://127.0.0.1:{port}/metrics" in capfd.readouterr().err
