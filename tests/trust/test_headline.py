"""One headline throughput: the demo's progress bar, the sheet, report.html and
`stepscope index` show the same steady-state tokens/s and MFU.

A real `stepscope demo` (12 steps of the tiny GPT on the CPU) run as a subprocess.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import orjson

from stepscope.report.terminal import fmt_num, fmt_pct
from support.browser import embedded, offline_page

STEPSCOPE = str(Path(sys.executable).parent / "stepscope")


def _json(*args: str) -> dict:  # type: ignore[type-arg]
    out = subprocess.run([STEPSCOPE, *args, "--json"], capture_output=True, check=True,
                         timeout=300).stdout
    return orjson.loads(out)  # type: ignore[no-any-return]


def test_progress_bar_sheet_html_and_index_agree(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "demo"
    proc = subprocess.run([STEPSCOPE, "demo", "--steps", "12", "--out", str(run)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    bar = re.findall(r"steady.state[^:]*: (\S+) tok/s  MFU (\S+)", proc.stdout)
    assert bar, proc.stdout
    sheet = _json("report", str(run), "--no-html")
    tps, mfu = fmt_num(sheet["tokens_per_s"]), fmt_pct(sheet["mfu"])
    assert bar[-1] == (tps, mfu)
    text = embedded(run / "report.html")["run"]["text"]
    assert (text["tokens_per_s"], text["mfu"]) == (tps, mfu)
    with offline_page(run / "report.html") as page:  # what a reader sees, drawn by Chromium
        assert page.inner_text("[data-k=tokens_per_s]") == tps
        assert page.inner_text("[data-k=mfu]") == mfu
    index = _json("index", str(tmp_path / "runs"))
    (row,) = index["runs"]
    assert (row["tokens_per_s"], row["mfu"]) == (sheet["tokens_per_s"], sheet["mfu"])
