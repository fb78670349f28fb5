// Draws a Grafana dashboard JSON (the subset onebit.json uses: rows, stat and timeseries
// panels, units, value mappings, stacking, log scale, overrides for color, dashes, right
// axis, points, step lines) from Prometheus's query_range API. Plain SVG, no library.
"use strict";

const PALETTE = ["#73BF69", "#F2CC0C", "#8AB8FF", "#FF780A", "#F2495C", "#5794F2", "#B877D9",
                 "#705DA0", "#37872D", "#FADE2A", "#447EBC", "#C15C17", "#890F02", "#0A437C"];
const COLORS = { green: "#73BF69", yellow: "#FADE2A", blue: "#5794F2", orange: "#FF9830",
                 red: "#F2495C", purple: "#B877D9" };
const ROW_H = 30, MARGIN = 8;

const params = new URLSearchParams(location.search);
const now = Math.floor(Date.now() / 1000);
const to = Number(params.get("to") || now);
const from = Number(params.get("from") || to - 900);
const step = Math.max(1, Math.round((to - from) / 300));
const rateInterval = params.get("rate_interval") || "10s";
let pending = 0;

function color(c) { return COLORS[c] || c; }

function fmt(v, unit, decimals) {
  if (v === null || !isFinite(v)) return "-";
  const d = (x, n) => x.toFixed(decimals !== undefined ? decimals : n);
  const a = Math.abs(v);
  if (unit === "s") {
    if (a === 0) return "0 s";
    if (a < 1e-3) return d(v * 1e6, 0) + " µs";
    if (a < 1) return d(v * 1e3, a < 0.01 ? 2 : 1) + " ms";
    return d(v, 2) + " s";
  }
  if (unit === "decbytes") {
    const units = ["B", "kB", "MB", "GB", "TB"];
    let i = 0, x = v;
    while (Math.abs(x) >= 1000 && i < units.length - 1) { x /= 1000; i++; }
    return d(x, i === 0 ? 0 : 1) + " " + units[i];
  }
  if (unit === "percentunit") return d(v * 100, 1) + "%";
  if (decimals !== undefined) return v.toFixed(decimals);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(1);
  if (a >= 100) return v.toFixed(0);
  if (a >= 1) return v.toFixed(2).replace(/\.?0+$/, "");
  return v.toPrecision(2);
}

function legendText(format, metric) {
  if (!format) return Object.entries(metric).map(([k, v]) => `${k}="${v}"`).join(", ") || "value";
  return format.replace(/\{\{\s*(\w+)\s*\}\}/g, (_, k) => metric[k] !== undefined ? metric[k] : "");
}

async function queryRange(expr) {
  expr = expr.replace(/\$\{?__rate_interval\}?|\$\{?__interval\}?/g, rateInterval);
  const url = `/api/v1/query_range?query=${encodeURIComponent(expr)}&start=${from}&end=${to}&step=${step}`;
  const r = await fetch(url);
  const j = await r.json();
  if (j.status !== "success") throw new Error(j.error || "query failed");
  return j.data.result.map(s => ({
    metric: s.metric,
    points: s.values.map(([t, v]) => [Number(t), Number(v)]).filter(([, v]) => isFinite(v)),
  }));
}

async function panelSeries(panel) {
  const out = [];
  for (const t of panel.targets || []) {
    const series = await queryRange(t.expr);
    for (const s of series) {
      out.push({ name: legendText(t.legendFormat, s.metric), labeled: !!t.legendFormat, points: s.points });
    }
  }
  return out;
}

function override(panel, name) {
  const props = {};
  for (const o of (panel.fieldConfig && panel.fieldConfig.overrides) || []) {
    if (o.matcher.id === "byName" && o.matcher.options === name) {
      for (const p of o.properties) props[p.id] = p.value;
    }
  }
  return props;
}

function el(tag, attrs, parent) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}

function niceTicks(lo, hi, n, integer) {
  if (hi === lo) { hi = lo + 1; lo = lo - (lo === 0 ? 0 : 1); }
  const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  let stepv = [1, 2, 2.5, 5, 10].map(m => m * mag).find(s => s >= raw);
  if (integer) stepv = Math.max(1, Math.round(stepv));  // no repeated labels with 0 decimals
  const ticks = [];
  for (let v = Math.ceil(lo / stepv) * stepv; v <= hi + 1e-9 * stepv; v += stepv) ticks.push(v);
  return { lo: Math.min(lo, ticks[0]), hi: Math.max(hi, ticks[ticks.length - 1]), ticks };
}

function drawTimeseries(box, panel, series) {
  const defaults = panel.fieldConfig.defaults || {};
  const custom = defaults.custom || {};
  const unit = defaults.unit, decimals = defaults.decimals;
  const stacked = custom.stacking && custom.stacking.mode === "normal";
  const logScale = custom.scaleDistribution && custom.scaleDistribution.type === "log";
  const W = box.clientWidth, H = box.clientHeight - 24;
  // The legend first: its laid-out height is what the plot leaves to it.
  const legend = document.createElement("div"); legend.className = "legend";
  box.appendChild(legend);
  const legendH = () => Math.max(15, legend.offsetHeight) + 8;
  series.forEach((s, i) => {
    const o = override(panel, s.name);
    s.color = o.color ? color(o.color.fixedColor) : PALETTE[i % PALETTE.length];
    s.dash = o["custom.lineStyle"] ? o["custom.lineStyle"].dash.join(",") : null;
    s.right = o["custom.axisPlacement"] === "right";
    const last = s.points.length ? s.points[s.points.length - 1][1] : null;
    const item = document.createElement("span"); item.className = "item";
    item.innerHTML = `<i style="background:${s.color}"></i>`;
    item.appendChild(document.createTextNode(`${s.name}  ${fmt(last, s.right ? undefined : unit, decimals)}`));
    legend.appendChild(item);
  });
  const svg = el("svg", { width: W, height: H - legendH(), style: "position:absolute;top:24px;left:0" });
  box.appendChild(svg);
  if (series.length === 0 || series.every(s => s.points.length === 0)) {
    const nd = document.createElement("div"); nd.className = "nodata"; nd.textContent = "No data";
    box.appendChild(nd); return;
  }
  if (stacked) {  // cumulative sums at shared timestamps
    const acc = new Map();
    for (const s of series) {
      s.points = s.points.map(([t, v]) => { const b = acc.get(t) || 0; acc.set(t, b + v); return [t, b + v, b]; });
    }
  }
  const hasRight = series.some(s => s.right);
  const padL = 58, padR = hasRight ? 58 : 12, padT = 8, padB = 20;
  const pw = W - padL - padR, ph = (H - legendH()) - padT - padB;
  const x = t => padL + (t - from) / (to - from) * pw;
  function axis(sel) {
    const vals = sel.flatMap(s => s.points.map(p => p[1]).concat(stacked ? s.points.map(p => p[2]) : []))
      .filter(v => isFinite(v) && (!logScale || v > 0));
    if (!vals.length) return null;
    let lo = Math.min(...vals), hi = Math.max(...vals);
    if (logScale) {
      const l = Math.floor(Math.log10(lo)), h = Math.ceil(Math.log10(hi));
      const ticks = []; for (let e = l; e <= Math.max(h, l + 1); e++) ticks.push(Math.pow(10, e));
      return { log: true, lo: ticks[0], hi: ticks[ticks.length - 1], ticks };
    }
    if (!stacked && lo > 0 && lo < hi * 0.5) lo = 0;
    if (stacked || unit === "s" || unit === "decbytes") lo = Math.min(0, lo);
    return niceTicks(lo, hi, Math.max(2, Math.floor(ph / 40)), decimals === 0);
  }
  const left = axis(series.filter(s => !s.right)), right = hasRight ? axis(series.filter(s => s.right)) : null;
  const yOf = a => v => a.log
    ? padT + ph - (Math.log10(v) - Math.log10(a.lo)) / (Math.log10(a.hi) - Math.log10(a.lo)) * ph
    : padT + ph - (v - a.lo) / (a.hi - a.lo) * ph;
  if (left) for (const t of left.ticks) {
    const yy = yOf(left)(t);
    el("line", { x1: padL, x2: padL + pw, y1: yy, y2: yy, stroke: "#2c2d33" }, svg);
    el("text", { x: padL - 6, y: yy + 3, "text-anchor": "end" }, svg).textContent = fmt(t, unit, left.log ? undefined : decimals);
  }
  if (right) for (const t of right.ticks) {
    el("text", { x: padL + pw + 6, y: yOf(right)(t) + 3 }, svg).textContent = fmt(t, undefined, decimals);
  }
  // Time axis: about one label per 110 px, on whole minutes where the range allows.
  const span = to - from, nT = Math.max(2, Math.floor(pw / 110));
  const tStep = [15, 30, 60, 120, 300, 600, 900, 1800, 3600].find(s => span / s <= nT) || 3600;
  for (let t = Math.ceil(from / tStep) * tStep; t <= to; t += tStep) {
    const xx = x(t);
    el("line", { x1: xx, x2: xx, y1: padT, y2: padT + ph, stroke: "#222327" }, svg);
    const d = new Date(t * 1000);
    el("text", { x: xx, y: padT + ph + 14, "text-anchor": "middle" }, svg).textContent =
      d.toISOString().substr(11, tStep < 60 ? 8 : 5);
  }
  for (const s of series) {
    const a = s.right ? right : left;
    if (!a || !s.points.length) continue;
    const y = yOf(a);
    const pts = s.points.filter(p => !a.log || p[1] > 0);
    if (custom.drawStyle === "points") {
      for (const p of pts) el("circle", { cx: x(p[0]), cy: y(p[1]), r: (custom.pointSize || 5) / 2, fill: s.color }, svg);
      continue;
    }
    // Split at gaps (a missing step means no value there).
    const segs = []; let cur = [];
    for (const p of pts) {
      if (cur.length && p[0] - cur[cur.length - 1][0] > step * 1.5) { segs.push(cur); cur = []; }
      cur.push(p);
    }
    if (cur.length) segs.push(cur);
    for (const seg of segs) {
      let d = "";
      seg.forEach((p, i) => {
        if (i === 0) d += `M${x(p[0])},${y(p[1])}`;
        else if (custom.lineInterpolation === "stepAfter") d += `H${x(p[0])}V${y(p[1])}`;
        else d += `L${x(p[0])},${y(p[1])}`;
      });
      const fill = (custom.fillOpacity || 0) / 100;
      if (fill > 0) {
        const base = p => stacked ? y(p[2]) : y(Math.max(a.lo, a.log ? a.lo : 0));
        let area = d;
        for (let i = seg.length - 1; i >= 0; i--) area += `L${x(seg[i][0])},${base(seg[i])}`;
        el("path", { d: area + "Z", fill: s.color, "fill-opacity": fill, stroke: "none" }, svg);
      }
      el("path", { d, fill: "none", stroke: s.color, "stroke-width": custom.lineWidth || 1,
                   "stroke-dasharray": s.dash || "none" }, svg);
      if (seg.length === 1) el("circle", { cx: x(seg[0][0]), cy: y(seg[0][1]), r: 2, fill: s.color }, svg);
    }
  }
}

function drawStat(box, panel, series) {
  const defaults = panel.fieldConfig.defaults || {};
  const mappings = ((defaults.mappings || [])[0] || {}).options || {};
  const wrap = document.createElement("div"); wrap.className = "stats";
  if (!series.length) { wrap.innerHTML = '<div class="stat"><div class="v" style="color:#6e7580">No data</div></div>'; }
  for (const s of series) {
    const last = s.points.length ? s.points[s.points.length - 1][1] : null;
    const m = last !== null ? mappings[String(last)] : null;
    const fixed = defaults.color && defaults.color.fixedColor ? color(defaults.color.fixedColor) : "#73BF69";
    const div = document.createElement("div"); div.className = "stat";
    div.innerHTML = `<div class="v" style="color:${m ? color(m.color) : fixed}"></div><div class="l"></div>`;
    div.firstChild.textContent = m ? m.text : fmt(last, defaults.unit, defaults.decimals);
    div.lastChild.textContent = s.labeled ? s.name : "";  // Grafana: no legend, no label
    wrap.appendChild(div);
  }
  box.appendChild(wrap);
}

async function main() {
  const dash = await (await fetch("/dashboard.json")).json();
  document.getElementById("title").textContent = dash.title;
  const iso = t => new Date(t * 1000).toISOString().replace("T", " ").substr(0, 19);
  document.getElementById("range").textContent = `${iso(from)} to ${iso(to)} UTC`;
  const grid = document.getElementById("grid");
  const colW = (grid.clientWidth + MARGIN) / 24;
  let bottom = 0;
  const jobs = [];
  for (const p of dash.panels) {
    const g = p.gridPos;
    const left = g.x * colW, top = g.y * (ROW_H + MARGIN);
    const w = g.w * colW - MARGIN, h = g.h * (ROW_H + MARGIN) - MARGIN;
    bottom = Math.max(bottom, top + h);
    if (p.type === "row") {
      const r = document.createElement("div"); r.className = "row";
      Object.assign(r.style, { left: left + "px", top: top + "px", width: w + "px" });
      r.textContent = p.title; grid.appendChild(r); continue;
    }
    const box = document.createElement("div"); box.className = "panel";
    Object.assign(box.style, { left: left + "px", top: top + "px", width: w + "px", height: h + "px" });
    box.innerHTML = '<div class="ptitle"></div>';
    box.firstChild.textContent = p.title;
    grid.appendChild(box);
    jobs.push(panelSeries(p).then(series => {
      if (p.type === "stat") drawStat(box, p, series); else drawTimeseries(box, p, series);
    }).catch(e => {
      const nd = document.createElement("div"); nd.className = "nodata"; nd.textContent = "Error: " + e.message;
      box.appendChild(nd);
    }));
  }
  grid.style.height = bottom + "px";
  await Promise.all(jobs);
  document.body.setAttribute("data-ready", "1");
}
main();
