"""`stepscope serve`: the JSON API over a root of real runs, and the page in a real browser
(Debian's Chromium driven by Playwright; skipped with the reason where either is absent)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stepscope import RunDir
from stepscope.analysis.series import step_series
from stepscope.report.serve import make_server
from stepscope.report.serve_data import Dashboard, NotFound
from support.serving import at, origin

DATA = Path(__file__).resolve().parents[1] / "data"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Screenshots of each page, kept after the run for a person to look at (build/ is ignored).
ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "test-artifacts"
XSS = "<img src=x onerror=window.__xss=1>"
# Requests here wait for the index (as long as it takes on a loaded host): the tests pin
# what a fresh index holds; test_a_cold_root_is_listed_before_it_is_indexed the other case.
WAIT_S = 300.0


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for name in ("run-ddp-two-ranks", "run-torn-last-line"):
        shutil.copytree(DATA / name, tmp_path / name)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "run.json").write_text("{not json")
    return tmp_path


@pytest.fixture
def server(root: Path) -> Iterator[str]:
    srv = make_server(str(root), port=0, refresh_s=0.0, index_wait_s=WAIT_S)
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
    status, doc = _get(at(server, "api/runs"))
    assert status == 200
    assert sorted(r["path"] for r in doc["runs"]) == ["run-ddp-two-ranks", "run-torn-last-line"]
    assert [s["path"] for s in doc["skipped"]] == ["broken"]
    _, doc = _get(at(server, "api/runs?where=num_devices%3E%3D2"))
    assert [r["path"] for r in doc["runs"]] == ["run-ddp-two-ranks"]
    _, doc = _get(at(server, "api/runs?q=torn"))
    assert [r["path"] for r in doc["runs"]] == ["run-torn-last-line"]
    status, doc = _get(at(server, "api/runs?where=no_such_column%3D1"))
    assert status == 400 and doc["error"]


def test_series_equal_the_records_and_nothing_outside_root_is_served(server: str,
                                                                     root: Path) -> None:
    status, doc = _get(at(server, "api/series?path=run-ddp-two-ranks"))
    assert status == 200
    table, _ = RunDir.open(root / "run-ddp-two-ranks").read_steps()
    for tag, (steps, vals) in step_series(table).items():
        if tag.startswith("ranks/"):  # ranks are drawn as the fleet's bands and heatmap
            assert tag not in doc["series"]
            continue
        assert doc["series"][tag]["steps"] == steps.tolist()
        assert doc["series"][tag]["hi"] == pytest.approx(vals.tolist(), rel=1e-12)
    assert len(doc["heatmap"]["values"]) == 2 and doc["heatmap"]["ranks"] == [0, 1]
    times = {r: table.rank(r)["step_time_s"] for r in (0, 1)}
    assert doc["fleet"]["max"] == pytest.approx(np.maximum(*times.values()).tolist())
    assert doc["fleet"]["min"] == pytest.approx(np.minimum(*times.values()).tolist())
    rows0 = [json.loads(x) for x in
             (root / "run-ddp-two-ranks/steps/rank-00000.jsonl").read_text().splitlines()]
    assert doc["series"]["result/loss"]["hi"] == [r["loss"] for r in rows0]
    for bad in ("..", "../..", "/etc", "broken", "run-ddp-two-ranks/steps"):
        status, _ = _get(at(server, f"api/run?path={bad}"))
        assert status == 404, bad


def test_run_and_compare_documents(server: str) -> None:
    status, doc = _get(at(server, "api/run?path=run-torn-last-line"))
    assert status == 200 and doc["sheet"]["steps"] == 7
    assert any("torn" in p for p in doc["read_problems"])
    status, doc = _get(at(server, "api/compare?a=run-torn-last-line&b=run-ddp-two-ranks"))
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


_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]


def _wait(page: Any, expr: str, timeout_s: float = 20.0) -> None:
    """Poll ``expr`` from outside the page: the page's own CSP forbids the eval that
    Playwright's wait_for_function runs inside it (which is the point of the CSP)."""
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(expr):
        assert time.monotonic() < deadline, f"timed out waiting for {expr}"
        page.wait_for_timeout(100)


def _watch(page: Any, base: str) -> tuple[list[str], list[str]]:
    """Page errors, and every request that left ``base`` (there must be none)."""
    errors: list[str] = []
    outside: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: None if r.url.startswith(base) else outside.append(r.url))
    return errors, outside


def test_dashboard_in_chromium_lists_runs_draws_charts_and_compares(server: str) -> None:
    sync_api = _browser()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors, outside = _watch(page, origin(server))
        page.goto(server)
        page.wait_for_selector("#runs tr td")
        assert page.locator("#runs tr").count() == 3  # header + 2 runs
        assert "broken" in page.inner_text("#skipped")
        page.fill("#where", "num_devices>=2")
        _wait(page, "document.querySelectorAll('#runs tr').length === 2")
        page.fill("#where", "")
        _wait(page, "document.querySelectorAll('#runs tr').length === 3")
        page.screenshot(path=str(ARTIFACTS / "serve-runs.png"), full_page=True)
        page.click("text=ddp")
        page.wait_for_selector(".uplot")
        assert page.locator(".uplot").count() >= 9
        # every chart drew something and names its units
        assert page.evaluate("charts.every(c => c.data[1].some(v => v !== null))")
        labels = page.evaluate("charts.map(c => [c.axes[0].label, c.axes[1].label])")
        assert all(x == "step" and y for x, y in labels), labels
        assert {"seconds", "GiB", "tokens/s", "% of peak"} <= {y for _, y in labels}
        page.screenshot(path=str(ARTIFACTS / "serve-run.png"), full_page=True)
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
        assert page.locator(".uplot").count() == 3  # loss, tokens/s, step time overlaid
        page.screenshot(path=str(ARTIFACTS / "serve-compare.png"), full_page=True)
        assert errors == [] and outside == []
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
        _, outside = _watch(page, origin(server))
        page.goto(server + "#/run/run-torn-last-line")
        page.wait_for_selector(".uplot")
        assert page.is_visible("#live")
        assert page.evaluate("charts[0].data[0].length") == 7
        last = json.loads(whole[-1])
        extra = [{**last, "step": last["step"] + i + 1} for i in range(3)]
        with open(steps_file, "a") as fh:
            fh.write("".join(json.dumps(r) + "\n" for r in extra))
        # The page polls every second; the generous bound only keeps a loaded CI host green.
        _wait(page, "charts.length && charts[0].data[0].length === 10")
        assert outside == []
        browser.close()


def test_a_zoomed_window_is_served_at_full_resolution(server: str) -> None:
    _, whole = _get(at(server, "api/series?path=run-ddp-two-ranks"))
    status, part = _get(at(server, "api/series?path=run-ddp-two-ranks&steps=2:4"))
    assert status == 200 and part["window"] == [2, 4]
    assert part["series"]["result/loss"]["steps"] == [2, 3, 4]
    assert part["series"]["result/loss"]["hi"] == whole["series"]["result/loss"]["hi"][2:5]
    status, doc = _get(at(server, "api/series?path=run-ddp-two-ranks&steps=oops"))
    assert status == 400 and "FIRST:LAST" in doc["error"]
    status, tail = _get(at(server, "api/series?path=run-ddp-two-ranks&steps=3:"))
    assert status == 200 and tail["series"]["result/loss"]["steps"] == [3, 4, 5]


def test_every_answer_forbids_outside_loads(server: str) -> None:
    for path in ("", "assets/dashboard.js", "api/runs", "api/nope"):
        try:
            with urllib.request.urlopen(at(server, path), timeout=30) as r:
                headers = r.headers
        except urllib.error.HTTPError as e:
            headers = e.headers
        assert "default-src 'self'" in headers["Content-Security-Policy"], path


def test_a_non_loopback_host_needs_the_printed_token(root: Path) -> None:
    srv = make_server(str(root), host="0.0.0.0", port=0, refresh_s=0.0, index_wait_s=WAIT_S)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        assert srv.token and f"?token={srv.token}" in srv.url
        base = f"http://127.0.0.1:{srv.server_address[1]}/"
        assert _get(base + "api/runs")[0] == 403
        assert _get(base + "api/runs?token=wrong")[0] == 403
        assert _get(base + f"api/runs?token={srv.token}")[0] == 200
        req = urllib.request.Request(base + "assets/dashboard.js",
                                     headers={"Cookie": f"stepscope_token={srv.token}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200
    finally:
        srv.shutdown()
        srv.server_close()


def _status(url: str, headers: dict[str, str]) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_on_loopback_every_request_needs_the_printed_token(server: str) -> None:
    """Any local user can reach 127.0.0.1: without the token of the printed URL (or its
    cookie, set by the page the URL opens) the runs are not served."""
    base = origin(server)
    assert "?token=" in server
    for path in ("", "api/runs", "api/run?path=run-ddp-two-ranks", "assets/dashboard.js"):
        assert _status(base + path, {}) == 403, path
        assert _status(at(base + "?token=wrong", path), {}) == 403, path
    with urllib.request.urlopen(server, timeout=30) as r:  # the printed URL: page + cookie
        cookie = r.headers["Set-Cookie"].split(";")[0]
    assert _status(base + "api/runs", {"Cookie": cookie}) == 200


def test_a_foreign_host_header_is_refused(server: str) -> None:
    """DNS rebinding: a page at evil.example whose name now points at 127.0.0.1 sends its
    own name as Host; only loopback names are answered (421), token or not."""
    url = at(server, "api/runs")
    port = urllib.parse.urlsplit(server).port
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}"):
        assert _status(url, {"Host": host}) == 421, host
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
        assert _status(url, {"Host": host}) == 200, host


def test_a_host_given_with_host_is_answered_and_others_are_not(root: Path) -> None:
    srv = make_server(str(root), host="127.0.0.2", port=0, refresh_s=0.0,
                      index_wait_s=WAIT_S)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = at(srv.url, "api/runs")
        assert url.startswith("http://127.0.0.2:")
        assert _status(url, {}) == 200
        assert _status(url, {"Host": "evil.example"}) == 421
    finally:
        srv.shutdown()
        srv.server_close()


def _xss_run(root: Path) -> str:
    """A run whose name, finding, alert and profile op name carry script payloads."""
    name = "xss" + XSS.replace("/", "")
    run = root / name
    shutil.copytree(DATA / "run-torn-last-line", run)
    meta = json.loads((run / "run.json").read_text())
    meta["name"] = f"<script>window.__xss=2</script>{XSS}"
    meta["baseline"]["model_name"] = XSS
    (run / "run.json").write_text(json.dumps(meta))
    with open(run / "events.jsonl", "a") as fh:
        fh.write(json.dumps({"type": "alert", "step": 3, "severity": "warning",
                             "message": XSS}) + "\n")
    prof = run / "profiles" / "20260101T000000Z"
    prof.mkdir(parents=True)
    doc = {"status": "analyzed", "report": {"ranks": {}, "top_ops": [
        {"name": XSS, "kind": "cpu", "count": 1, "total_us": 5.0, "share_pct": 100.0}]}}
    prof.with_name(prof.name + ".analysis.json").write_text(json.dumps(doc))
    return name


def test_script_in_run_supplied_strings_stays_inert(root: Path) -> None:
    sync_api = _browser()
    name = _xss_run(root)
    srv = make_server(str(root), port=0, refresh_s=0.0, index_wait_s=WAIT_S)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=_ARGS)
            page = browser.new_page()
            errors, outside = _watch(page, origin(srv.url))
            page.goto(srv.url)
            page.wait_for_selector("#runs tr td")
            assert "<script>window.__xss=2</script>" in page.inner_text("#runs")
            page.goto(srv.url + "#/run/" + urllib.parse.quote(name, safe=""))
            page.wait_for_selector(".uplot")
            assert XSS in page.inner_text("#app")  # shown as text
            assert page.evaluate("window.__xss === undefined")
            assert page.locator("#app img").count() == 0
            assert errors == [] and outside == []
            browser.close()
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_cold_root_is_listed_before_it_is_indexed(root: Path) -> None:
    """No index yet and no wait: the runs come from run.json at once, marked pending, and
    the numbers arrive with the background index (the page's 2-second reload)."""
    board = Dashboard(root, refresh_s=0.0, index_wait_s=0.0)
    doc = board.runs()
    assert doc["indexing"] is True
    assert sorted(r["path"] for r in doc["runs"]) == ["run-ddp-two-ranks", "run-torn-last-line"]
    assert all(r["pending"] and r["valid"] and r.get("steps") is None for r in doc["runs"])
    assert board.series("run-ddp-two-ranks")["series"]["result/loss"]["steps"]  # servable
    with pytest.raises(NotFound):
        board.series("../outside")
    deadline = time.monotonic() + 300
    while doc["indexing"]:
        assert time.monotonic() < deadline, doc
        time.sleep(0.2)
        doc = board.runs()
    assert {r["path"]: r["steps"] for r in doc["runs"]} == {"run-ddp-two-ranks": 6,
                                                           "run-torn-last-line": 7}
    assert [s["path"] for s in doc["skipped"]] == ["broken"]
