/* stepscope dashboard: the run page's static sections (regimes, isolation experiments, what
   the reader skipped, the fleet line). Loaded after charts.js, before dashboard.js. */
"use strict";

/* What the reader skipped (torn or corrupt records, dropped values), above everything else. */
function readBlock(doc) {
  const r = doc.read, skipped = (r && r.skipped) || doc.sheet.skipped_records || 0;
  if (!skipped && !(r && r.rejected) && !doc.read_problems.length) return "";
  const line = (r && r.summary) || `${skipped} corrupt or torn record(s) skipped`;
  return `<div id="read-warning" class="warnbox"><b>${num(skipped)} record(s) skipped</b>: ${esc(line)}
    ${doc.read_problems.length ? `<details><summary>first problems</summary><pre>${
      esc(doc.read_problems.join("\n"))}</pre></details>` : ""}</div>`;
}

/* A first view from a sample of the step files while the full read runs (serve_partial):
   said as such, and the sheet's numbers marked provisional when they come from the sample. */
const provisional = (doc) => Boolean(doc.partial && doc.partial.sheet === "sample");
function partialBlock(doc, ser) {
  const p = doc.partial || ser.partial;
  if (!p) return "";
  return `<div id="partial" class="warnbox"><b>Provisional view</b>: drawn from a sample of
    ${num(p.records)} of ~${num(p.estimated_records)} records (evenly spaced windows of the step
    files: a spike between them is not drawn)${provisional(doc) ? "; the sheet's numbers are " +
    "estimates from that sample" : ""}. Full data loading…</div>`;
}

/* Regimes (analysis/regimes): the table the terminal prints, and the bands drawn on charts. */
const REGIME_COLOR = { contention: "rgba(217,72,15,0.13)", waiting: "rgba(112,72,232,0.13)",
  throttling: "rgba(198,40,40,0.13)", "more work": "rgba(11,114,133,0.13)" };
const regimeColor = (cause) => REGIME_COLOR[cause] || "rgba(217,138,0,0.13)";

/* The regimes a chart shades: every one but the steady (reference) regime. */
function shadedRegimes(sheet) {
  const regs = (sheet && sheet.regimes) || [];
  return regs.length < 2 ? [] : regs.filter((r) => !r.steady).map((r) => ({
    first: r.first_step, last: r.last_step, cause: r.cause, name: r.name,
    evidence: r.evidence || "", color: regimeColor(r.cause) }));
}

function regimesBlock(doc) {
  const t = doc.text || {};
  if (!t.regime_rows || !t.regime_rows.length) return "";
  const legend = shadedRegimes(doc.sheet).map((r) => `<li><i class="sw" style="background:${
    r.color.replace("0.13", "0.6")}"></i>${esc(r.name)}: <b>${esc(r.cause)}</b> ${esc(r.evidence)}</li>`).join("");
  return `<h2>Regimes</h2><p class="muted">* = steady state, used by the headline numbers;
    the others are shaded on the charts, coloured by cause.</p>
    <table id="regimes"><tr>${t.regime_header.map((h) => `<th>${esc(h)}</th>`).join("")}</tr>${
      t.regime_rows.map((row) => `<tr>${row.map((c) => `<td>${esc(c)}</td>`).join("")}</tr>`).join("")}</table>
    <ul id="regime-legend" class="legend">${legend}</ul>`;
}

/* Isolation experiments recorded in events.jsonl (`stepscope demo --slow-data`, isolate). */
function isolationBlock(events) {
  const iso = events.filter((e) => e.type === "isolation" && e.result);
  if (!iso.length) return "";
  return `<h2>Isolation experiments</h2><div id="isolation">${iso.map((e) => {
    const r = e.result;
    return `<div class="card"><h3>Isolation experiment (${esc(r.kind === "data" ? "slow data" : r.kind)})</h3>
      <div class="kv"><span>verdict</span><span class="v">${esc(r.verdict)}</span>
      <span>rate</span><span class="v">${num(r.baseline_rate)} → ${num(r.experiment_rate)} ${esc(r.unit)}</span>
      <span>share of the time</span><span class="v">${pct(r.share)}</span>
      <span>steps</span><span class="v">${num(r.baseline_steps)} → ${num(r.experiment_steps)}</span></div>
      <p>${esc(r.message)}</p>${e.experiment_run ? `<div class="muted">experiment run: ${esc(e.experiment_run)}</div>` : ""}</div>`;
  }).join("")}</div>`;
}

/* The slowest ranks of the fleet, by their median step time over the fleet's median. */
function fleetLine(fleet) {
  if (!fleet || !fleet.slowest.length) return "";
  return `<p id="slowest">Slowest ranks (median step time over the fleet's median): ${
    fleet.slowest.map(([r, x]) => `rank ${esc(r)} (${x.toFixed(2)}x)`).join(", ")}</p>`;
}
