/* stepscope dashboard: formats, the uPlot line chart with its markers, the rank heatmap.
   Loaded before dashboard.js (both are plain scripts sharing the page's globals). */
"use strict";

const $ = (sel, el = document) => el.querySelector(sel);
const app = () => $("#app");
const esc = (s) => String(s ?? "").replace(/[&<>"']/g,
  (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));

/* ---- number formats for people: 12,730 tokens/s, 41.2%, 3.1 GiB ---- */
function num(v, digits = 3) {
  if (v === null || v === undefined || !isFinite(v)) return "–";
  const a = Math.abs(v);
  if (Number.isInteger(v) && a < 1000) return String(v);  // counts: 150, not 150.0
  if (a >= 1000) return Math.round(v).toLocaleString("en-US");
  if (a >= 100) return v.toFixed(1);
  if (a === 0) return "0";
  return Number(v.toPrecision(digits)).toString();
}
const pct = (v) => (v === null || v === undefined || !isFinite(v) ? "–" : (100 * v).toFixed(1) + "%");
const gib = (b) => (b === null || b === undefined || !isFinite(b) ? "–" : (b / 2 ** 30).toFixed(2) + " GiB");
const secs = (s) => (s === null || s === undefined || !isFinite(s) ? "–" :
  s >= 1 ? s.toFixed(3) + " s" : (1000 * s).toFixed(2) + " ms");

let charts = [];

/* ================================ charts ================================ */
const SEV_COLOR = { critical: "#c62828", warning: "#d98a00", info: "#2a6bb3" };
const COLORS = ["#2a6bb3", "#d9480f", "#2e7d32", "#7048e8", "#c2255c", "#0b7285"];

function ema(values, alpha) {
  if (!alpha) return values;
  let acc = null;
  return values.map((v) => (v === null ? acc : (acc = acc === null ? v : alpha * acc + (1 - alpha) * v)));
}

/* x values for a series' steps under the chosen axis (step, tokens seen, wall seconds) */
function xFor(steps, axis, x) {
  if (axis === "step" || !x[axis]) return steps;
  const m = new Map(x[axis].steps.map((s, i) => [s, x[axis].value[i]]));
  return steps.map((s) => (m.has(s) ? m.get(s) : null));
}

/* regimes: [{first, last, color}] shaded from their first to their last step */
function markerHook(marks, warmup, axisSteps, regimes = []) {
  return {
    drawClear: [(u) => {
      const left = u.bbox.left, right = u.bbox.left + u.bbox.width;
      for (const r of regimes) {
        const a = Math.max(left, u.valToPos(axisSteps(r.first), "x", true));
        const b = Math.min(right, u.valToPos(axisSteps(r.last), "x", true));
        if (!isFinite(a) || !isFinite(b) || b <= a) continue;
        u.ctx.save(); u.ctx.fillStyle = r.color;
        u.ctx.fillRect(a, u.bbox.top, b - a, u.bbox.height);
        u.ctx.restore();
      }
      if (!warmup) return;
      const x1 = u.valToPos(axisSteps(warmup), "x", true);
      const x0 = u.bbox.left;
      if (!isFinite(x1) || x1 <= x0) return;
      u.ctx.save(); u.ctx.fillStyle = "rgba(120,130,140,0.12)";
      u.ctx.fillRect(x0, u.bbox.top, Math.min(x1, u.bbox.left + u.bbox.width) - x0, u.bbox.height);
      u.ctx.restore();
    }],
    draw: [(u) => {
      u.ctx.save();
      for (const m of marks) {
        const px = u.valToPos(axisSteps(m.step), "x", true);
        if (!isFinite(px) || px < u.bbox.left || px > u.bbox.left + u.bbox.width) continue;
        u.ctx.strokeStyle = SEV_COLOR[m.severity] || "#888"; u.ctx.lineWidth = 2;
        u.ctx.setLineDash([4, 3]);
        u.ctx.beginPath(); u.ctx.moveTo(px, u.bbox.top); u.ctx.lineTo(px, u.bbox.top + u.bbox.height);
        u.ctx.stroke();
      }
      u.ctx.restore();
    }],
  };
}

/* y tick labels: as many decimals as the tick spacing needs, thousands and up as k/M/G/T
   (8,166,707,131 tokens/s is "8.17G" on an axis), below 0.001 in exponent form (3e-4) */
function tickLabels(fmt) {
  return (u, ticks, axisIdx, space, incr) => {
    if (fmt) return ticks.map((t) => fmt(t));
    const big = Math.max(0, ...ticks.map((t) => Math.abs(t)));
    const [scale, suffix] = [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]]
      .find(([k]) => big >= k) || [1, ""];
    const step = (incr || big || 1) / scale;
    if (scale === 1 && big > 0 && big < 1e-3) {
      return ticks.map((t) => (t === 0 ? "0" : t.toExponential(Math.min(6, Math.max(0,
        Math.round(Math.log10(Math.abs(t)) - Math.log10(step)))))));
    }
    let d = 0;
    while (d < 6 && Math.abs(Math.round(step * 10 ** d) - step * 10 ** d) > 1e-6 * 10 ** d) d++;
    return ticks.map((t) => (t === 0 ? "0" : (t / scale).toFixed(d) + suffix));
  };
}

/* whole steps on a step axis (no "step 2.5"): 1, 2, 5, 10, 20, 50, ... */
const STEP_INCRS = Array.from({ length: 30 }, (_, i) => [1, 2, 5][i % 3] * 10 ** Math.floor(i / 3));

/* the y axis as wide as its longest tick label (uPlot's own size callback) */
function axisSize(u, values, axisIdx, cycleNum) {
  const axis = u.axes[axisIdx];
  let size = axis.ticks.size + axis.gap + (axis.labelSize ?? 30);
  const longest = (values || []).reduce((a, v) => (String(v).length > a.length ? String(v) : a), "");
  if (longest) {
    u.ctx.font = axis.font[0];
    size += u.ctx.measureText(longest).width / devicePixelRatio;
  }
  size = Math.ceil(size) + 4;
  // uPlot lays out again while the sizes change: only growing keeps that finite.
  return cycleNum > 1 ? Math.max(size, axis._size || 0) : size;
}

/* one chart: lines = [{label, steps, hi, lo?}], smoothed copies drawn over faint raw ones */
function lineChart(el, title, lines, opts) {
  const { axis, x, smooth, marks, warmup, unit = "", fromZero = false, fmt = num, fill = false,
          yLabel = "", onZoom = null, regimes = [] } = opts;
  const wrap = document.createElement("div");
  wrap.className = "chart";
  wrap.innerHTML = `<div class="title">${esc(title)}</div>` +
    (regimes.length ? '<div class="regime-at"></div>' : "");
  el.appendChild(wrap);
  const allSteps = [...new Set(lines.flatMap((l) => l.steps))].sort((a, b) => a - b);
  const idx = new Map(allSteps.map((s, i) => [s, i]));
  const xs = xFor(allSteps, axis, x);
  const keep = xs.map((v) => v !== null);
  const data = [xs.filter((_, i) => keep[i])];
  const series = [{ label: axis === "step" ? "step" : axis === "tokens" ? "tokens" : "wall s" }];
  const bands = [];
  lines.forEach((l, k) => {
    const col = COLORS[k % COLORS.length];
    const raw = new Array(allSteps.length).fill(null);
    const lo = new Array(allSteps.length).fill(null);
    l.steps.forEach((s, i) => { raw[idx.get(s)] = l.hi[i]; lo[idx.get(s)] = (l.lo || l.hi)[i]; });
    const f = (arr) => arr.filter((_, i) => keep[i]);
    const hasBand = l.lo && l.lo.some((v, i) => v !== l.hi[i]);
    if (hasBand) {
      data.push(f(lo));
      series.push({ label: l.loLabel || `${l.label} (bin min)`, stroke: col + "55", width: 1,
                    value: (u, v) => fmt(v) + unit });
      bands.push({ series: [data.length, data.length - 1], fill: col + "22" });
    }
    data.push(f(raw));
    series.push({ label: smooth ? `${l.label} (raw)` : l.label, stroke: smooth ? col + "66" : col,
                  width: smooth ? 1 : 1.5, value: (u, v) => fmt(v) + unit, spanGaps: true,
                  ...(fill ? { fill: col + "33" } : {}) });
    if (smooth) {
      data.push(ema(f(raw), smooth));
      series.push({ label: `${l.label} (smoothed)`, stroke: col, width: 2, value: (u, v) => fmt(v) + unit,
                    spanGaps: true });
    }
  });
  const stepToX = (s) => {  // a step (recorded or not) to the chosen x axis
    if (axis === "step") return s;
    let i = idx.get(s);
    if (i === undefined) {  // the last recorded step before s
      let lo = 0, hi = allSteps.length - 1;
      while (lo < hi) { const m = (lo + hi + 1) >> 1; if (allSteps[m] <= s) lo = m; else hi = m - 1; }
      i = lo;
    }
    return xs[i] ?? s;
  };
  const keptSteps = allSteps.filter((_, i) => keep[i]);
  const regimeAt = (u) => {  // the regime under the cursor, named with its cause
    const el = wrap.querySelector(".regime-at");
    if (!el) return;
    const s = u.cursor.idx === null || u.cursor.idx === undefined ? null : keptSteps[u.cursor.idx];
    const r = s === null ? null : regimes.find((g) => s >= g.first && s <= g.last);
    el.textContent = r ? `${r.name}: ${r.cause}${r.evidence ? ` (${r.evidence})` : ""}` : "";
  };
  const u = new uPlot({
    width: Math.max(320, wrap.clientWidth - 16), height: 220,
    cursor: { sync: { key: "run" }, drag: { x: true, y: false } },
    scales: { x: { time: false }, y: fromZero ? { range: (u, mn, mx) => [0, mx > 0 ? mx * 1.05 : 1] } : {} },
    axes: [{ label: axis === "step" ? "step" : axis === "tokens" ? "tokens seen" : "wall time (s)",
             ...(axis === "step" ? { incrs: STEP_INCRS } : {}) },
           { label: yLabel, size: axisSize, values: tickLabels(opts.fmt) }],
    legend: { live: true },
    series, bands,
    hooks: { ...markerHook(marks || [], warmup, stepToX, regimes),
             setCursor: [regimeAt],
             setSelect: [(u) => {
               if (!onZoom || u.select.width < 2) return;
               const lo = u.posToVal(u.select.left, "x"), hi = u.posToVal(u.select.left + u.select.width, "x");
               onZoom(Math.floor(lo), Math.ceil(hi));
             }] },
  }, data, wrap);
  charts.push(u);
  return u;
}

function heatColor(ratio) {
  if (ratio === null || !isFinite(ratio)) return [235, 238, 241];
  const t = Math.max(-1, Math.min(1, Math.log2(ratio)));  // 0.5x .. 2x of the median
  const lerp = (a, b, k) => Math.round(a + (b - a) * k);
  return t < 0 ? [lerp(247, 59, -t), lerp(247, 111, -t), lerp(247, 182, -t)]
               : [lerp(247, 198, t), lerp(247, 40, t), lerp(247, 40, t)];
}

function drawHeatmap(canvas, hm) {
  const rows = hm.ranks.length, cols = hm.steps.length;
  canvas.width = Math.max(cols, 1); canvas.height = Math.max(rows, 1);
  canvas.style.height = Math.min(Math.max(rows * 6, 60), 420) + "px";
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(canvas.width, canvas.height);
  hm.values.forEach((row, r) => row.forEach((v, c) => {
    const [R, G, B] = heatColor(v === null || !hm.median ? null : v / hm.median);
    const o = 4 * (r * canvas.width + c);
    img.data[o] = R; img.data[o + 1] = G; img.data[o + 2] = B; img.data[o + 3] = 255;
  }));
  ctx.putImageData(img, 0, 0);
  const tip = $("#tip");
  canvas.onmousemove = (e) => {
    const b = canvas.getBoundingClientRect();
    const c = Math.floor((e.clientX - b.left) / b.width * cols);
    const r = Math.floor((e.clientY - b.top) / b.height * rows);
    if (r < 0 || r >= rows || c < 0 || c >= cols) { tip.hidden = true; return; }
    const v = hm.values[r][c];
    tip.textContent = `rank ${hm.ranks[r]}, steps from ${hm.steps[c]}\nstep time ${secs(v)}` +
      (v !== null && hm.median ? ` (${(v / hm.median).toFixed(2)}x median)` : "");
    tip.style.left = e.clientX + 12 + "px"; tip.style.top = e.clientY + 12 + "px"; tip.hidden = false;
  };
  canvas.onmouseleave = () => { tip.hidden = true; };
}
