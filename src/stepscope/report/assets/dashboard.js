/* stepscope dashboard: runs table, run page, A/B page. Plain JS + uPlot (vendored). */
"use strict";

/* Offline report: the documents are embedded (a JSON element) and there is no server. */
const OFFLINE = (() => { const el = document.getElementById("stepscope-data");
  return el ? JSON.parse(el.textContent) : null; })();
const TOKEN = new URLSearchParams(location.search).get("token");
const api = async (path, params = {}) => {
  if (OFFLINE) {
    if (path === "run" || path === "series") return OFFLINE[path];
    if (path === "findings") return { findings: OFFLINE.run.findings };
    throw new Error("this report is a single run; `stepscope serve` shows the others");
  }
  const q = new URLSearchParams();
  if (TOKEN) q.append("token", TOKEN);
  for (const [k, v] of Object.entries(params)) {
    (Array.isArray(v) ? v : [v]).forEach((x) => x !== undefined && x !== "" && q.append(k, x));
  }
  const r = await fetch(`/api/${path}?${q}`);
  const doc = await r.json();
  if (!r.ok) throw new Error(doc.error || r.statusText);
  return doc;
};

let timers = [];
let pageGen = 0;  // bumped by each new page: an answer for the page before is dropped
function clearPage() {
  pageGen++;
  timers.forEach(clearInterval); timers = [];
  charts.forEach((c) => c.destroy()); charts = [];
  $("#live").hidden = true;
}

/* ================================ runs table ================================ */
const RUN_COLS = [
  ["status", "status", (r) => `<span class="badge ${esc(r.status)}">${esc(r.status)}</span>`],
  ["path", "run", (r) => `<a href="#/run/${encodeURIComponent(r.path)}">${esc(r.name || r.path)}</a>` +
    (r.valid ? "" : ' <span class="muted">not a valid training run (no step records)</span>') +
    `<div class="muted">${esc(r.path)}</div>`],
  ["model_name", "model", (r) => esc(r.model_name)],
  ["num_devices", "devices", (r) => num(r.num_devices), true],
  ["steps", "steps", (r) => num(r.steps), true],
  ["tokens_per_s", "tokens/s", (r) => num(r.tokens_per_s), true],
  ["mfu", "MFU", (r) => pct(r.mfu), true],
  ["step_time_s", "step time", (r) => secs(r.step_time_s), true],
  ["loss_last", "loss (last)", (r) => num(r.loss_last, 4), true],
  ["data_wait_frac", "data wait", (r) => pct(r.data_wait_frac), true],
  ["comm_frac", "comm", (r) => pct(r.comm_frac), true],
  ["mem_peak_bytes", "memory peak", (r) => gib(r.mem_peak_bytes), true],
  ["created_utc", "created", (r) => esc((r.created_utc || "").replace("T", " ").slice(0, 19))],
];
// The table draws the first ROWS_SHOWN runs of the sorted, filtered list (a thousand rows
// took seconds to lay out on a loaded host); "show all" draws the rest.
const ROWS_SHOWN = 200;
const listState = { q: "", where: "", sort: "-created_utc", selected: new Set(), all: false };

async function showRuns() {
  $("#where-am-i").textContent = "runs";
  app().innerHTML = `
    <div class="controls">
      <input id="q" type="text" placeholder="search name, path, model" value="${esc(listState.q)}">
      <input id="where" type="text" placeholder="filter, e.g. num_devices>=8; status=finished"
             value="${esc(listState.where)}">
      <button id="cmp" disabled>Compare 2 selected</button>
      <span id="count" class="muted"></span>
    </div>
    <div id="runs-err" class="err"></div>
    <div style="overflow-x:auto"><table id="runs"></table></div>
    <div id="skipped"></div>`;
  let t;
  const later = () => { clearTimeout(t); t = setTimeout(loadRuns, 250); };
  $("#q").addEventListener("input", (e) => { listState.q = e.target.value; later(); });
  $("#where").addEventListener("input", (e) => { listState.where = e.target.value; later(); });
  $("#cmp").addEventListener("click", () => {
    const [a, b] = [...listState.selected];
    location.hash = `#/compare/${encodeURIComponent(a)}/${encodeURIComponent(b)}`;
  });
  await loadRuns();
  timers.push(setInterval(loadRuns, 2000));
}

async function loadRuns() {
  let doc;
  try {
    doc = await api("runs", { q: listState.q, sort: listState.sort,
      where: listState.where.split(";").map((s) => s.trim()).filter(Boolean) });
    $("#runs-err").textContent = "";
  } catch (e) { $("#runs-err").textContent = e.message; return; }
  const head = "<tr><th></th>" + RUN_COLS.map(([k, label, , n]) => {
    const arrow = listState.sort === k ? " ▲" : listState.sort === "-" + k ? " ▼" : "";
    return `<th data-k="${k}" class="${n ? "num" : ""}">${label}${arrow}</th>`; }).join("") + "</tr>";
  const shown = listState.all ? doc.runs : doc.runs.slice(0, ROWS_SHOWN);
  const rows = shown.map((r) => `<tr class="${r.valid ? "" : "invalid"}">
      <td><input type="checkbox" data-p="${esc(r.path)}" ${listState.selected.has(r.path) ? "checked" : ""}></td>` +
    RUN_COLS.map(([, , f, n]) => `<td class="${n ? "num" : ""}">${f(r)}</td>`).join("") + "</tr>");
  const more = doc.runs.length - shown.length;
  $("#runs").innerHTML = head + rows.join("") + (more > 0 ? `<tr><td colspan="${RUN_COLS.length + 1}"
    class="muted">… ${more} more runs: search or filter, or <a id="all-runs">show all</a></td></tr>` : "");
  $("#count").textContent = `${doc.runs.length} run(s) under ${doc.root}` +
    (doc.indexing ? " · indexing: the numbers fill in as the runs are read" : "");
  const all = $("#all-runs");
  if (all) all.addEventListener("click", () => { listState.all = true; loadRuns(); });
  $("#runs").querySelectorAll("th[data-k]").forEach((th) => th.addEventListener("click", () => {
    const k = th.dataset.k;
    listState.sort = listState.sort === "-" + k ? k : "-" + k;
    loadRuns();
  }));
  $("#runs").querySelectorAll("input[type=checkbox]").forEach((cb) => cb.addEventListener("change", () => {
    cb.checked ? listState.selected.add(cb.dataset.p) : listState.selected.delete(cb.dataset.p);
    $("#cmp").disabled = listState.selected.size !== 2;
  }));
  $("#cmp").disabled = listState.selected.size !== 2;
  $("#skipped").innerHTML = doc.skipped.length ? `<h2>Not valid training runs</h2><ul>` +
    doc.skipped.map((s) => `<li><b>${esc(s.path)}</b>: ${esc(s.reason)}</li>`).join("") + "</ul>" : "";
}

/* ================================ run page ================================ */
const runState = { axis: "step", smooth: 0 };

function sheetCards(sheet, meta, text = {}) {
  /* rows: [label, value] or [label, value, key]; a key names the value for readers (tests) */
  const kv = (rows) => `<div class="kv">${rows.map(([k, v, key]) =>
    `<span>${k}</span><span class="v"${key ? ` data-k="${key}"` : ""}>${v}</span>`).join("")}</div>`;
  const phases = Object.entries(sheet.phase_frac || {}).map(([k, v]) => `${esc(k)} ${pct(v)}`).join(" · ");
  return `<div class="cards">
    <div class="card"><h3>Result</h3>${kv([
      ["loss first → last", `${num(sheet.loss_first, 4)} → ${num(sheet.loss_last, 4)}`],
      ["loss min", num(sheet.loss_min, 4)], ["perplexity", num(sheet.perplexity)],
      ["accuracy (last)", pct(sheet.accuracy_last)]])}</div>
    <div class="card"><h3>Efficiency</h3>${kv([
      ["tokens/s", esc(text.tokens_per_s ?? num(sheet.tokens_per_s)), "tokens_per_s"],
      ["samples/s", num(sheet.samples_per_s)],
      ["step time (median / p90)", `${secs(sheet.step_time_s)} / ${secs(sheet.step_time_p90_s)}`],
      ["MFU", esc(text.mfu ?? pct(sheet.mfu)), "mfu"], ["HFU", pct(sheet.hfu), "hfu"]])}
      <div class="muted">${esc(text.headline_note || "steady state")}, all ranks</div>
      <div class="muted">${esc(sheet.mfu_note)}</div></div>
    <div class="card"><h3>System</h3>${kv([
      ["memory peak", gib(sheet.mem_peak_bytes)], ["data wait", pct(sheet.data_wait_frac)],
      ["communication (exposed)", `${pct(sheet.comm_frac)} (${pct(sheet.comm_exposed_frac)})`],
      ["steps / ranks / warm-up", `${num(sheet.steps)} / ${num(sheet.ranks)} / ${num(sheet.warmup_steps)}`]])}
      <div class="muted">${esc(sheet.mem_source)}</div>
      <div id="conditions">conditions: ${esc(text.conditions || "not recorded")}</div>
      <div>${phases}</div><div class="muted">${esc(sheet.phase_source)}</div></div>
  </div>` + ((sheet.notes || []).length ? `<ul>${sheet.notes.map((n) => `<li>${esc(n)}</li>`).join("")}</ul>` : "");
}

function findingsList(findings) {
  if (!findings.length) return '<p class="muted">No findings.</p>';
  return `<ul class="findings">${findings.map((f, i) => `<li>
    <span class="sev-${esc(f.severity)}">${esc(f.severity)}</span> <b>${esc(f.category)}</b>
    ${f.rank !== null && f.rank !== undefined ? `(rank ${esc(f.rank)})` : ""}: ${esc(f.message)}
    ${f.steps ? ` <a data-f="${i}">steps ${esc(f.steps[0])}–${esc(f.steps[1])}</a>` : ""}
    ${f.recommendation ? `<div class="muted">next: ${esc(f.recommendation)}</div>` : ""}</li>`).join("")}</ul>`;
}

function perRankTable(ranks) {
  if (!ranks || ranks.length < 2) return '<p class="muted">One rank.</p>';
  const perRank = [...ranks].sort((a, b) => (b.step_time_s ?? -Infinity) - (a.step_time_s ?? -Infinity));
  return `<table id="per-rank"><tr><th>rank</th><th class="num">step time</th><th class="num">tokens/s</th>
    <th class="num">data wait</th><th class="num">comm</th><th class="num">compute</th></tr>` + perRank.slice(0, 16).map((r) =>
    `<tr><td>${esc(r.rank)}</td><td class="num">${secs(r.step_time_s)}</td><td class="num">${num(r.tokens_per_s)}</td>
     <td class="num">${pct(r.data_wait_frac)}</td><td class="num">${pct(r.comm_frac)}</td>
     <td class="num">${pct(r.compute_frac)}</td></tr>`).join("") +
    (perRank.length > 16 ? `<tr><td colspan="6" class="muted">… ${perRank.length - 16} more ranks: see the heatmap</td></tr>` : "") + "</table>";
}

function profileBlock(p, events = []) {
  if (!p) return '<p class="muted">No profile captured (<code>stepscope run --profile-steps a:b</code>).</p>';
  const rep = p.report;
  if (!rep) return `<p>${esc(p.profile_dir)}: ${esc(p.status)}</p>`;
  const ev = events.filter((e) => e.type === "profile" && String(e.dir || "").endsWith(p.profile_dir)).pop();
  const window = ev && ev.steps ? `steps ${esc(ev.steps)} (both ends included), ` : "";
  // The slowest ranks first, 16 of them: a 1,024-rank capture is the heatmap's to show.
  const all = Object.entries(rep.ranks || {}).sort(([, a], [, b]) =>
    (b.step_time_median_us ?? -Infinity) - (a.step_time_median_us ?? -Infinity));
  const more = all.length > 16 ? `<tr><td colspan="6" class="muted">… ${all.length - 16} more ranks</td></tr>` : "";
  const ranks = all.slice(0, 16).map(([r, d]) => `<tr><td>${esc(r)}</td>
    <td class="num">${num(d.compute_pct)}%</td><td class="num">${num(d.idle_pct)}%</td>
    <td class="num">${num(d.comm_comp_overlap_pct)}%</td><td class="num">${num((d.step_time_median_us || 0) / 1000)} ms</td>
    <td>${Object.entries(d.phase_means_us || {}).map(([k, v]) => `${esc(k)} ${num(v / 1000)} ms`).join(" · ")}</td></tr>`).join("");
  const ops = (rep.top_ops || []).slice(0, 15).map((o) => `<tr><td>${esc(o.op_type || "")}</td><td title="${esc(o.name)}">${esc(o.name)}</td>
    <td>${esc(o.kind)}</td><td class="num">${num(o.count)}</td><td class="num">${num(o.total_us / 1000)} ms</td>
    <td class="num">${num(o.share_pct)}%</td></tr>`).join("");
  return `<p class="muted" id="profile-window">capture ${esc(p.profile_dir)}: ${window}mean per profiled step (${esc(p.status)})</p>
    <div class="scroll-x"><table id="profile-ranks"><tr><th>rank</th><th class="num">compute</th><th class="num">idle</th><th class="num">overlap</th>
    <th class="num">step (median)</th><th>phases (mean)</th></tr>${ranks}${more}</table></div>
    <h3 style="margin-top:10px">Top ops</h3>
    <div class="scroll-x"><table><tr><th>type</th><th>op</th><th>kind</th><th class="num">calls</th><th class="num">total</th><th class="num">share</th></tr>${ops}</table></div>`;
}

function kvTable(obj) {
  const rows = Object.entries(obj || {}).filter(([, v]) => v !== null && v !== "");
  return `<table>${rows.map(([k, v]) => `<tr><td>${esc(k)}</td><td>${esc(typeof v === "object" ? JSON.stringify(v) : v)}</td></tr>`).join("")}</table>`;
}

const CHARTS = [
  ["Loss", ["result/loss"], { yLabel: "loss" }], ["Learning rate", ["train/lr"], { yLabel: "lr" }],
  ["Gradient norm", ["train/grad_norm"], { yLabel: "L2 norm" }],
  ["Loss scale", ["train/loss_scale"], { yLabel: "scale" }],
  ["Step time (slowest rank)", ["efficiency/step_time_s"], { unit: " s", fromZero: true, yLabel: "seconds" }],
  ["Tokens/s", ["efficiency/tokens_per_s"], { fromZero: true, yLabel: "tokens/s" }],
  ["MFU", ["efficiency/mfu"], { fromZero: true, fmt: (v) => pct(v), yLabel: "% of peak" }],
  ["Memory peak", ["system/mem_peak_gib"], { fromZero: true, unit: " GiB", yLabel: "GiB" }],
  ["Data wait", ["system/data_wait_s"], { fromZero: true, unit: " s", yLabel: "seconds" }],
  ["Communication", ["system/comm_s"], { fromZero: true, unit: " s", yLabel: "seconds" }],
];

function drawRunCharts(doc, ser, onZoom = null) {
  const regimes = provisional(doc) ? [] : shadedRegimes(doc.sheet);
  charts.forEach((c) => c.destroy()); charts = [];
  const el = $("#charts"); el.innerHTML = "";
  const marks = doc.findings.filter((f) => f.steps).map((f) => ({ step: f.steps[0], severity: f.severity }));
  for (const ev of doc.events.filter((e) => e.type === "alert" && e.step !== undefined)) {
    marks.push({ step: ev.step, severity: ev.severity || "warning" });
  }
  for (const [title, tags, o] of CHARTS) {
    const lines = tags.filter((t) => ser.series[t]).map((t) => ({ label: title, ...ser.series[t] }));
    if (!lines.length) continue;
    lineChart(el, title, lines, { axis: runState.axis, x: ser.x, smooth: runState.smooth,
      marks, warmup: ser.warmup_steps, onZoom: runState.axis === "step" ? onZoom : null,
      regimes, ...o });
  }
  const fl = ser.fleet;
  if (fl) {  // a fleet: median over ranks, 10-90% and min-max bands of each step bin's means
    lineChart(el, `Step time across ${fl.ranks} ranks`, [
      { label: "slowest rank", loLabel: "fastest rank", steps: fl.steps, lo: fl.min, hi: fl.max },
      { label: "90% of ranks", loLabel: "10% of ranks", steps: fl.steps, lo: fl.p10, hi: fl.p90 },
      { label: `median of ${fl.ranks} ranks`, steps: fl.steps, hi: fl.median }],
      { axis: runState.axis, x: ser.x, smooth: 0, marks, warmup: ser.warmup_steps, unit: " s",
        fromZero: true, yLabel: "seconds", onZoom: runState.axis === "step" ? onZoom : null,
        regimes });
  }
  const ph = ser.phases;
  if (ph.steps.length) {
    const names = Object.keys(ph.cols);
    let acc = ph.steps.map(() => 0);
    const stacked = names.map((n) => (acc = acc.map((a, i) => a + (ph.cols[n][i] || 0))));
    lineChart(el, "Phase split per step (stacked, mean over ranks)",
      names.map((n, k) => ({ label: n.replace(/_s$/, ""), steps: ph.steps, hi: stacked[k] })),
      { axis: runState.axis, x: ser.x, smooth: 0, marks: [], warmup: ser.warmup_steps, unit: " s",
        fromZero: true, fill: true, yLabel: "seconds", regimes });
  }
}

async function showRun(path, got = null) {
  $("#where-am-i").textContent = path;
  const gen = pageGen;
  if (!got) app().innerHTML = '<p class="muted">Loading run…</p>';
  let doc, ser;
  // First paint from the sheet and the series; diagnose (slower) fills the findings after.
  // ``got``: the documents already fetched (the full ones that replace a partial view).
  try { [doc, ser] = got || await Promise.all([api("run", { path, findings: "0" }), api("series", { path })]); }
  catch (e) { app().innerHTML = `<p class="err">${esc(e.message)}</p>`; return; }
  const partial = !OFFLINE && Boolean(doc.partial || ser.partial);
  const m = doc.meta;
  let findings = doc.findings.length ? doc.findings : null;
  app().innerHTML = `
    <h2>${esc(m.name || m.run_id)} <span class="badge ${esc(m.status)}">${esc(m.status)}</span></h2>
    <div class="muted">${esc(path)} · created ${esc(m.created_utc)} · run ${esc(m.run_id)}</div>
    ${m.error ? `<p class="err">${esc(m.error)}</p>` : ""}
    ${m.command ? `<pre>${esc(m.command.join(" "))}</pre>` : ""}
    ${readBlock(doc)}${partialBlock(doc, ser)}
    <div id="sheet"${provisional(doc) ? ' class="provisional"' : ""}>${sheetCards(doc.sheet, m, doc.text)}</div>
    ${provisional(doc) ? "" : regimesBlock(doc)}
    <h2>Findings</h2><div id="findings"><p class="muted">Diagnosing…</p></div>
    <h2>Charts</h2>
    <div class="controls">x axis:
      <select id="axis"><option value="step">step</option><option value="tokens">tokens</option>
      <option value="wall_s">wall time (s)</option></select>
      smoothing <input id="smooth" type="range" min="0" max="0.98" step="0.02" value="${runState.smooth}">
      <button id="whole" hidden>whole run</button>
      <span class="muted">drag across a chart to zoom (the window is fetched at full resolution),
      double-click to reset; warm-up is shaded grey, other regimes than the steady one in
      their cause's colour (hover for the cause), findings and alerts are dashed lines</span></div>
    <div id="charts" class="charts"></div>
    ${isolationBlock(doc.events)}
    <h2>Ranks</h2>${fleetLine(ser.fleet)}
    <div class="fleet"><div><canvas id="heat" class="heat"></canvas>
      <div class="legend-scale">0.5x <i></i> 2x of the median step time (rank × step)</div></div>
      <div class="scroll-x"><h3>Slowest ranks first</h3>${provisional(doc) ?
        '<p class="muted">After the full read.</p>' : perRankTable(doc.sheet.per_rank)}</div></div>
    <h2>Latest profile</h2><div id="profile">${profileBlock(doc.profile, doc.events)}</div>
    <h2>Run</h2>
    <details open><summary>Baseline</summary>${kvTable(m.baseline)}</details>
    <details><summary>Environment</summary>${kvTable(m.environment)}</details>
    <details><summary>Config</summary>${kvTable(m.config)}</details>
    <details><summary>Events (${doc.events.length})</summary><pre>${esc(doc.events.map((e) => JSON.stringify(e)).join("\n"))}</pre></details>
    ${doc.read_problems.length ? `<details><summary>Read problems</summary><pre>${esc(doc.read_problems.join("\n"))}</pre></details>` : ""}`;
  /* Zoom: the window is fetched again at full resolution and, on a live run, polled like
     the whole run (it keeps its window). A window that reaches the newest step follows the
     live edge (open-ended, hi = null); one in the past stays where it is. */
  let windowed = null;  // the zoomed window's series document
  let win = null;       // [lo, hi | null] of that window
  const lastStep = (s) => Math.max(-Infinity, ...Object.values(s.series).map((v) =>
    v.steps.length ? v.steps[v.steps.length - 1] : -Infinity));
  const fetchWindow = (w) => api("series", { path, steps: `${w[0]}:${w[1] ?? ""}` });
  const zoom = OFFLINE ? null : async (lo, hi) => {
    const w = [lo, doc.meta.status === "running" && hi >= lastStep(ser) ? null : hi];
    try { windowed = await fetchWindow(w); win = w; } catch (e) { return; }
    redraw(); $("#whole").hidden = false;
  };
  const redraw = () => drawRunCharts(doc, windowed || ser, zoom);
  $("#whole").addEventListener("click", () => {
    windowed = null; win = null; $("#whole").hidden = true; redraw(); });
  $("#axis").value = runState.axis;
  $("#axis").addEventListener("change", (e) => { runState.axis = e.target.value; redraw(); });
  $("#smooth").addEventListener("change", (e) => { runState.smooth = +e.target.value; redraw(); });
  const showFindings = () => {
    doc.findings = findings || [];
    $("#findings").innerHTML = findingsList(doc.findings);
    $("#findings").querySelectorAll("a[data-f]").forEach((a) => a.addEventListener("click", () => {
      const f = doc.findings[+a.dataset.f];
      const lo = f.steps[0] - 10, hi = f.steps[1] + 10;
      runState.axis = "step"; $("#axis").value = "step";
      if (zoom) zoom(lo, hi);  // served: the same zoom as a drag, kept while polling
      else { redraw(); charts.forEach((c) => c.setScale("x", { min: lo, max: hi })); }
      $("#charts").scrollIntoView();
    }));
  };
  redraw();
  const diagnose = async () => {
    try { findings = (await api("findings", { path })).findings; } catch (e) { return; }
    if (gen !== pageGen) return;  // the page was drawn again meanwhile (or left)
    showFindings(); redraw();
  };
  if (findings) showFindings(); else diagnose();
  drawHeatmap($("#heat"), ser.heatmap);
  if (partial) {  // a sample first (serve_partial): the full documents redraw the page
    let busy = false;
    timers.push(setInterval(async () => {
      if (busy) return;
      busy = true;
      let next;
      try { next = await Promise.all([api("run", { path, findings: "0" }), api("series", { path })]); }
      catch (e) {  // the full read failed: say why rather than keep the sample up
        if (gen === pageGen) { clearPage(); app().innerHTML = `<p class="err">${esc(e.message)}</p>`; }
        return;
      } finally { busy = false; }
      if (next[0].partial || next[1].partial || gen !== pageGen) return;
      const y = window.scrollY;
      clearPage(); await showRun(path, next); window.scrollTo(0, y);
    }, 1000));
    return;  // a live run's polling starts with the full documents
  }
  if (m.status === "running" && !OFFLINE) {
    $("#live").hidden = false;
    let busy = false;
    timers.push(setInterval(async () => {  // within 2 s of new records: poll every second
      if (busy) return;
      busy = true;
      const w = win;
      let got;
      try { got = await Promise.all([api("run", { path, findings: "0" }), api("series", { path }),
                                     w ? fetchWindow(w) : null]); }
      catch (e) { return; } finally { busy = false; }
      [doc, ser] = got;
      if (w && win === w) windowed = got[2];  // unless the user zoomed again meanwhile
      doc.findings = findings || [];
      $("#sheet").innerHTML = sheetCards(doc.sheet, doc.meta, doc.text);
      redraw(); drawHeatmap($("#heat"), ser.heatmap);
      if (doc.meta.status !== "running") { $("#live").hidden = true; timers.forEach(clearInterval); }
    }, 1000));
  }
}

/* ================================ A/B page ================================ */
async function showCompare(a, b) {
  $("#where-am-i").textContent = `${a} vs ${b}`;
  let cmp, sa, sb;
  try { [cmp, sa, sb] = await Promise.all([api("compare", { a, b }), api("series", { path: a }), api("series", { path: b })]); }
  catch (e) { app().innerHTML = `<p class="err">${esc(e.message)}</p>`; return; }
  const speed = cmp.speed || {};
  const metrics = Object.entries(speed).filter(([, v]) => v && typeof v === "object" && "change" in v)
    .map(([name, v]) => ({ name, ...v }));
  const metricRows = metrics.map((mm) => `<tr><td>${esc(mm.name)}</td>
    <td class="num">${num(mm.a)}</td><td class="num">${num(mm.b)}</td>
    <td class="num">${mm.diff_rel !== undefined && mm.diff_rel !== null ? pct(mm.diff_rel) : "–"}</td>
    <td>${esc(mm.change || "")}</td></tr>`).join("");
  app().innerHTML = `<h2>A/B: ${esc(a)} → ${esc(b)}</h2>
    <div class="verdict">${esc(cmp.verdict)}</div>
    <div class="card" id="env-check"><h3>Environment check: ${(cmp.environment || []).length ?
      "the hosts' conditions differ" : "the hosts' conditions agree"}</h3>${
      (cmp.environment || []).map((d) => `<p>${esc(d.warning || `${d.variable}: ${JSON.stringify(d.a)} → ${JSON.stringify(d.b)}`)}</p>`).join("")}</div>
    <div class="cards"><div class="card"><h3>Speed ledger: ${esc(speed.verdict || "")}</h3>
      <div class="muted">${esc(speed.reason || "")}</div>
      <table><tr><th>metric</th><th class="num">A</th><th class="num">B</th><th class="num">change</th><th></th></tr>${metricRows}</table></div>
      <div class="card"><h3>Quality ledger: ${esc((cmp.quality || {}).verdict || "")}</h3>
      <table><tr><th>metric</th><th class="num">A</th><th class="num">B</th><th>at</th><th></th></tr>${
        Object.entries(cmp.quality || {}).filter(([, v]) => v && typeof v === "object" && "verdict" in v)
          .map(([name, v]) => `<tr><td>${esc(name)}</td><td class="num">${num(v.a, 4)}</td><td class="num">${num(v.b, 4)}</td>
            <td>${esc(Object.entries(v.at || {}).map(([k, x]) => `${k} ${num(x)}`).join(", "))}</td>
            <td>${esc(v.verdict)}${v.note ? ` <span class="muted">${esc(v.note)}</span>` : ""}</td></tr>`).join("")}</table>
      ${((cmp.quality || {}).warnings || []).map((w) => `<p class="muted">${esc(w)}</p>`).join("")}</div>
      <div class="card"><h3>What differs</h3>${(cmp.differing || []).length ?
        `<table>${cmp.differing.map((d) => `<tr><td>${esc(d.variable)}</td><td>${esc(JSON.stringify(d.a))}</td><td>→ ${esc(JSON.stringify(d.b))}</td></tr>`).join("")}</table>` :
        '<p class="muted">No baseline variable differs.</p>'}</div></div>
    <details><summary>Full comparison (JSON)</summary><pre>${esc(JSON.stringify(cmp, null, 2))}</pre></details>
    <h2>Overlay</h2><div id="charts" class="charts"></div>`;
  for (const [title, tag, o] of [["Loss", "result/loss", {}], ["Tokens/s", "efficiency/tokens_per_s", { fromZero: true }],
                                  ["Step time (s)", "efficiency/step_time_s", { fromZero: true }]]) {
    const lines = [[a, sa], [b, sb]].filter(([, s]) => s.series[tag]).map(([n, s]) => ({ label: n, ...s.series[tag] }));
    if (lines.length) lineChart($("#charts"), title, lines, { axis: "step", x: {}, smooth: 0, marks: [], warmup: 0, ...o });
  }
}

/* ================================ router ================================ */
function route() {
  clearPage();
  if (OFFLINE) return showRun(OFFLINE.run.path);
  const h = location.hash.replace(/^#\/?/, "");
  const parts = h.split("/").map(decodeURIComponent);
  if (parts[0] === "run" && parts[1]) return showRun(parts.slice(1).join("/"));
  if (parts[0] === "compare" && parts.length >= 3) return showCompare(parts[1], parts[2]);
  return showRuns();
}
window.addEventListener("hashchange", route);
route();
