"""`stepscope serve`: the JSON API over a root of real runs, and the page in a real browser
(Debian's Chromium driven by Playwright; skipped with the reason where either is absent)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stepscope import RunDir
from stepscope.analysis.series import step_series
from stepscope.report.serve import make_server

DATA = Path(__file__).resolve().parents[1] / "data"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for name in ("run-ddp-two-ranks", "run-torn-last-line"):
        shutil.copytree(DATA / name, tmp_path / name)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "run.json").write_text("{not json")
    return tmp_path


@pytest.fixture
def server(root: Path) -> Iterator[str]:
    srv = make_server(str(root), port=0, refresh_s=0.0)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1},
                              daemon=True)
    thread.start()
    yield srv.url
    srv.shutdown()
    srv.server_close()


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_run_list_filters_and_names_the_invalid_run(server: str) -> None:
    status, doc = _get(server + "api/runs")
    assert status == 200
    assert sorted(r["path"] for r in doc["runs"]) == ["run-ddp-two-ranks", "run-torn-last-line"]
    assert [s["path"] for s in doc["skipped"]] == ["broken"]
    _, doc = _get(server + "api/runs?where=num_devices%3E%3D2")
    assert [r["path"] for r in doc["runs"]] == ["run-ddp-two-ranks"]
    _, doc = _get(server + "api/runs?q=torn")
    assert [r["path"] for r in doc["runs"]] == ["run-torn-last-line"]
    status, doc = _get(server + "api/runs?where=no_such_column%3D1")
    assert status == 400 and doc["error"]


def test_series_equal_the_records_and_nothing_outside_root_is_served(server: str,
                                                                     root: Path) -> None:
    status, doc = _get(server + "api/series?path=run-ddp-two-ranks")
    assert status == 200
    table, _ = RunDir.open(root / "run-ddp-two-ranks").read_steps()
    for tag, (steps, vals) in step_series(table).items():
        assert doc["series"][tag]["steps"] == steps.tolist()
        assert doc["series"][tag]["hi"] == pytest.approx(vals.tolist(), rel=1e-12)
    assert len(doc["heatmap"]["values"]) == 2 and doc["heatmap"]["ranks"] == [0, 1]
    rows0 = [json.loads(x) for x in
             (root / "run-ddp-two-ranks/steps/rank-00000.jsonl").read_text().splitlines()]
    assert doc["series"]["result/loss"]["hi"] == [r["loss"] for r in rows0]
    for bad in ("..", "../..", "/etc", "broken", "run-ddp-two-ranks/steps"):
        status, _ = _get(server + f"api/run?path={bad}")
        assert status == 404, bad


def test_run_and_compare_documents(server: str) -> None:
    status, doc = _get(server + "api/run?path=run-torn-last-line")
    assert status == 200 and doc["sheet"]["steps"] == 7
    assert any("torn" in p for p in doc["read_problems"])
    status, doc = _get(server + "api/compare?a=run-torn-last-line&b=run-ddp-two-ranks")
    assert status == 200 and doc["verdict"] == "invalid"  # seq_len, devices, batch differ


def test_serve_cli_refuses_a_missing_root_and_a_busy_port(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "stepscope", "serve", *args],
                              capture_output=True, text=True, timeout=60, check=False)

    proc = run(str(tmp_path / "absent"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        proc = run(str(tmp_path), "--port", str(s.getsockname()[1]))
    assert proc.returncode == 2 and "pick another --port" in proc.stderr
    assert "Traceback" not in proc.stderr


def _browser() -> Any:
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    return sync_api


def test_dashboard_in_chromium_lists_runs_draws_charts_and_compares(server: str) -> None:
    sync_api = _browser()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(server)
        page.wait_for_selector("#runs tr td")
        assert page.locator("#runs tr").count() == 3  # header + 2 runs
        assert "broken" in page.inner_text("#skipped")
        page.fill("#where", "num_devices>=2")
        page.wait_for_function("document.querySelectorAll('#runs tr').length === 2")
        page.fill("#where", "")
        page.wait_for_function("document.querySelectorAll('#runs tr').length === 3")
        page.click("text=ddp")
        page.wait_for_selector(".uplot")
        assert page.locator(".uplot").count() >= 9
        # hover: the legend shows the exact value under the cursor
        over = page.locator(".uplot .u-over").first
        box = over.bounding_box()
        page.mouse.move(box["x"] + 2, box["y"] + box["height"] / 2)
        legend = page.locator(".uplot").first.locator(".u-legend .u-value").nth(1)
        assert legend.inner_text() not in ("", "–", "--")
        width = page.evaluate("document.querySelector('#heat').width")
        assert width == 6  # 6 steps, one column each
        page.goto(server + "#/")
        page.wait_for_selector("#runs input[type=checkbox]")
        for cb in page.locator("#runs input[type=checkbox]").all():
            cb.check()
        page.click("#cmp")
        page.wait_for_selector(".verdict")
        assert page.inner_text(".verdict") == "invalid"
        assert errors == []
        browser.close()


def test_a_live_run_redraws_as_it_writes(server: str, root: Path) -> None:
    sync_api = _browser()
    run = root / "run-torn-last-line"
    meta = json.loads((run / "run.json").read_text())
    meta["status"] = "running"
    (run / "run.json").write_text(json.dumps(meta))
    steps_file = run / "steps" / "rank-00000.jsonl"
    whole = [x for x in steps_file.read_text().splitlines() if x.endswith("}")]
    steps_file.write_text("\n".join(whole) + "\n")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        page = browser.new_page()
        page.goto(server + "#/run/run-torn-last-line")
        page.wait_for_selector(".uplot")
        assert page.is_visible("#live")
        assert page.evaluate("charts[0].data[0].length") == 7
        last = json.loads(whole[-1])
        extra = [{**last, "step": last["step"] + i + 1} for i in range(3)]
        with open(steps_file, "a") as fh:
            fh.write("".join(json.dumps(r) + "\n" for r in extra))
        page.wait_for_function("charts.length && charts[0].data[0].length === 10",
                               timeout=20_000)
        browser.close()
