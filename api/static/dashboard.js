// dse dashboard: vanilla JS over the REST API (/api/v1), charts with the plotly.min.js the
// app serves from the installed plotly package (never a CDN). No build step.
//
// Stable hooks for tests: #study-list li[data-study], #trial-table tbody tr[data-trial-id],
// badges with data-count / data-value, charts with data-rendered="true" once drawn, and
// #study-view[data-rendered="true"] when the summary, charts and table of the selected study
// are all on screen (data-render-ms: when that first happened, in ms since navigation).
"use strict";

const API = "/api/v1";
const PAGE_SIZE = 100;
// Charts are SVG (no WebGL: slow or missing without a GPU). A chart of more than DRAW_MAX
// points draws DRAW_MAX of them: the ones that matter (every new best, the Pareto front)
// and an even sample of the rest, which looks the same at the chart's size; the figure
// caption says how many are drawn.
const DRAW_MAX = 1000;
const FAILURE_STYLE = {
  oom: { name: "OOM", color: "#d62728", symbol: "x" },
  predicted_oom: { name: "predicted OOM (not run)", color: "#ff7f0e", symbol: "triangle-up-open" },
  invalid: { name: "invalid", color: "#7f7f7f", symbol: "square-x-open" },
  other: { name: "other failure", color: "#9467bd", symbol: "cross" },
};

const state = {
  pollMs: 3000,
  study: null, // name of the selected study
  signature: null, // what changed since the last full load
  offset: 0,
  filter: "",
  order: "number",
  trialId: null,
  timer: null,
  loading: null,
};

const $ = (sel) => document.querySelector(sel);

function el(tag, attrs = {}, text = null) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  if (text !== null && text !== undefined) e.textContent = String(text);
  return e;
}

function cell(child) {
  const td = document.createElement("td");
  td.append(child);
  return td;
}

function measure(name, start) {
  try { performance.measure(`dse:${name}`, { start }); } catch (_) { /* old browser */ }
}

async function api(path) {
  const t0 = performance.now();
  const r = await fetch(API + path, { headers: { Accept: "application/json" } });
  if (!r.ok) {
    let detail = r.statusText;
    try { detail = (await r.json()).detail; } catch (_) { /* not JSON */ }
    const err = new Error(`${r.status}: ${detail}`);
    err.status = r.status;
    throw err;
  }
  const body = await r.json();
  measure(`api ${path.split("?")[0]}`, t0);
  return body;
}

function setConn(ok, text) {
  const c = $("#conn-status");
  c.dataset.state = ok ? "ok" : "error";
  c.textContent = text;
}

// plotly.min.js (~4.8 MB) loads async from <head> (compiled while the API calls run).
const plotlyReady = new Promise((resolve) => {
  const done = () => { measure("plotly.min.js loaded", 0); resolve(window.Plotly || null); };
  if (window.Plotly || window.dsePlotlyFailed) { done(); return; }
  const s = document.getElementById("plotly-js");
  s.addEventListener("load", done);
  s.addEventListener("error", done);
});

function fmt(x, digits = 2) {
  if (x === null || x === undefined || Number.isNaN(x)) return "";
  if (typeof x !== "number") return String(x);
  return Math.abs(x) >= 1000 ? x.toFixed(0) : x.toFixed(digits);
}

function shortParams(p) {
  const abbrev = {
    tensor_model_parallel_size: "tp", pipeline_model_parallel_size: "pp",
    virtual_pipeline_model_parallel_size: "vpp", context_parallel_size: "cp",
    expert_model_parallel_size: "ep", micro_batch_size: "mbs",
    use_distributed_optimizer: "distopt", attention_backend: "attn",
    sequence_parallel: "sp",
  };
  return Object.entries(p || {}).map(([k, v]) => `${abbrev[k] || k}=${v}`).join(" ");
}

// --- studies list -----------------------------------------------------------------------

function renderStudyList(studies) {
  const ul = $("#study-list");
  ul.replaceChildren();
  $("#study-count").dataset.count = String(studies.length);
  $("#study-count").textContent = `(${studies.length})`;
  $("#no-studies").hidden = studies.length > 0;
  for (const s of studies) {
    const li = el("li", { "data-study": s.name, "data-state": s.state, tabIndex: 0 });
    if (s.name === state.study) li.classList.add("selected");
    li.append(el("span", { class: "study-name" }, s.name));
    li.append(el("span", { class: `state state-${s.state}`, "data-state": s.state }, s.state));
    const best = s.best_value === null ? "–" : fmt(s.best_value);
    li.append(el("div", { class: "muted small" },
      `${s.counts.total || 0} trials · best ${best} ${s.metric}`));
    li.addEventListener("click", () => selectStudy(s.name));
    li.addEventListener("keydown", (ev) => { if (ev.key === "Enter") selectStudy(s.name); });
    ul.append(li);
  }
}

async function refreshStudies() {
  const page = await api("/studies");
  renderStudyList(page.data);
  setConn(true, `live · ${new Date().toLocaleTimeString()}`);
  return page.data;
}

// --- one study ----------------------------------------------------------------------------

function signatureOf(study) {
  return JSON.stringify([study.state, study.counts, study.rejections, study.best_value]);
}

function setBadge(id, n, label) {
  const b = $(id);
  b.dataset.count = String(n);
  b.replaceChildren(el("b", {}, n), document.createTextNode(` ${label}`));
}

function renderSummary(s) {
  $("#study-name").textContent = s.name;
  const st = $("#study-state");
  st.textContent = s.state;
  st.dataset.state = s.state;
  st.className = `state state-${s.state}`;
  const hw = s.hardware || {};
  const hwText = [hw.world_size ? `${hw.world_size}×` : "", hw.gpu || hw.device || ""].join("");
  $("#study-objective").textContent =
    `${s.direction} ${s.metric}` + (hwText ? ` · ${hwText}` : "") +
    (s.model && s.model.num_layers ? ` · ${s.model.num_layers} layers, h=${s.model.hidden_size}` : "");
  const c = s.counts;
  setBadge("#badge-total", c.total || 0, "trials");
  for (const k of ["complete", "running", "queued", "failed", "infeasible"]) {
    setBadge(`#badge-${k}`, c[k] || 0, k);
  }
  setBadge("#badge-rejections", s.rejections, "rejected before launch");
  const gh = $("#badge-gpu-hours");
  gh.dataset.value = String(s.gpu_hours);
  gh.replaceChildren(el("b", {}, fmt(s.gpu_hours, 3)), document.createTextNode(" GPU-hours"));
  const bb = $("#badge-best");
  bb.dataset.value = s.best_value === null ? "" : String(s.best_value);
  bb.replaceChildren(
    el("b", {}, s.best_value === null ? "–" : fmt(s.best_value)),
    document.createTextNode(s.best_trial === null ? " best" : ` best (trial ${s.best_trial})`));
}

function renderTable(page) {
  const tbody = $("#trial-table tbody");
  tbody.replaceChildren();
  for (const t of page.data) {
    const m = t.metrics || {};
    const tr = el("tr", {
      "data-trial-id": String(t.id), "data-number": String(t.number), "data-state": t.state,
      "data-failure-class": t.failure_class || "",
    });
    if (t.id === state.trialId) tr.classList.add("selected");
    tr.append(
      el("td", {}, t.number),
      cell(el("span", { class: `state state-${t.state}` }, t.state)),
      el("td", { class: "num" }, fmt(t.value)),
      el("td", { class: "num" }, fmt(m.tflops_per_gpu)),
      el("td", { class: "num" }, fmt(m.peak_mem_gib)),
      el("td", { class: "num" }, fmt(m.step_time_s, 3)),
      el("td", { class: "num" }, fmt(t.gpu_seconds, 0)),
      el("td", {}, t.failure_class || ""),
      el("td", { class: "reason", title: t.reason || "" }, t.reason || ""),
      el("td", { class: "params" }, shortParams(t.params)),
    );
    tr.addEventListener("click", () => loadTrial(t.id));
    tbody.append(tr);
  }
  const info = $("#page-info");
  info.dataset.count = String(page.count);
  const first = page.count === 0 ? 0 : state.offset + 1;
  info.textContent = `${first}–${state.offset + page.data.length} of ${page.count}`;
  $("#page-prev").disabled = state.offset === 0;
  $("#page-next").disabled = state.offset + PAGE_SIZE >= page.count;
}

function renderRejections(page) {
  const tbody = $("#rejection-table tbody");
  tbody.replaceChildren();
  for (const r of page.data) {
    const tr = el("tr", { "data-kind": r.kind });
    tr.append(el("td", {}, r.kind), el("td", {}, r.rule),
      el("td", { class: "reason", title: r.reason }, r.reason),
      el("td", { class: "params" }, shortParams(r.params)));
    tbody.append(tr);
  }
  const c = $("#rejection-count");
  c.dataset.count = String(page.count);
  c.textContent = page.count > page.data.length
    ? `(${page.count}; first ${page.data.length} shown)` : `(${page.count})`;
}

// --- charts -------------------------------------------------------------------------------

const LAYOUT = {
  margin: { l: 55, r: 15, t: 30, b: 45 },
  height: 320,
  legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
  hovermode: "closest",
  paper_bgcolor: "rgba(0,0,0,0)",
};
const CONFIG = { displaylogo: false, responsive: true };

function failureGroup(kind) {
  return Object.hasOwn(FAILURE_STYLE, kind) && kind !== "other" ? kind : "other";
}

function pointText(p) {
  const head = p.number === null ? "rejected" : `trial ${p.number}`;
  return `${head} (${p.kind})<br>${shortParams(p.params)}` + (p.reason ? `<br>${p.reason.slice(0, 160)}` : "");
}

async function plot(div, traces, layout) {
  const Plotly = await plotlyReady;
  if (!Plotly) {
    div.textContent = "charts unavailable: /static/vendor/plotly.min.js did not load";
    div.dataset.rendered = "unavailable";
    return;
  }
  const t0 = performance.now();
  await Plotly.react(div, traces, { ...LAYOUT, ...layout }, CONFIG);
  measure(`plot #${div.id}`, t0);
  div.dataset.rendered = "true";
}

// At most `max` of `pts`: every `keep` point, then an even stride through the others.
function sample(pts, max, keep = () => false) {
  if (pts.length <= max) return pts;
  const kept = pts.filter(keep);
  const rest = pts.filter((p) => !keep(p));
  const room = Math.max(0, max - kept.length);
  const step = rest.length / Math.max(1, room);
  const picked = [];
  for (let i = 0; i < room && Math.floor(i * step) < rest.length; i++) {
    picked.push(rest[Math.floor(i * step)]);
  }
  return kept.concat(picked);
}

function setNote(id, shown, total, what) {
  const n = $(id);
  n.dataset.shown = String(shown);
  n.dataset.total = String(total);
  n.textContent = shown < total ? ` (${shown} of ${total} ${what} drawn; same picture)` : "";
}

function renderHistory(study, pareto) {
  const done = pareto.points.filter((p) => p.source === "trial" && p.value !== null);
  const maximize = study.direction === "maximize";
  const bestX = [], bestY = [];
  const improved = new Set();
  let best = null;
  for (const p of done) {
    if (best === null || (maximize ? p.value > best : p.value < best)) {
      best = p.value;
      improved.add(p);
      bestX.push(p.number);
      bestY.push(best);
    }
  }
  if (done.length) { bestX.push(done[done.length - 1].number); bestY.push(best); }
  const shown = sample(done, DRAW_MAX, (p) => improved.has(p));
  const traces = [
    { type: "scatter", mode: "lines", name: "best so far", x: bestX, y: bestY,
      line: { shape: "hv", color: "#2ca02c", width: 2 }, hoverinfo: "skip" },
    { type: "scatter", mode: "markers", name: "trial", x: shown.map((p) => p.number),
      y: shown.map((p) => p.value), text: shown.map(pointText), hoverinfo: "x+y+text",
      marker: { size: shown.length > 500 ? 5 : 8, color: "#1f77b4",
        line: { width: shown.length > 500 ? 0 : 1, color: "#fff" } } },
  ];
  const div = $("#chart-history");
  div.dataset.points = String(done.length);
  setNote("#note-history", shown.length, done.length, "trials");
  return plot(div, traces, {
    xaxis: { title: { text: "trial" }, tickformat: "d", rangemode: "tozero",
      dtick: Math.max(1, Math.ceil((bestX[bestX.length - 1] || 1) / 10)) },
    yaxis: { title: { text: study.metric } },
  });
}

function renderPareto(study, pareto) {
  const memCap = pareto.gpu_memory_gib;
  const complete = pareto.points.filter((p) => p.kind === "complete" && p.tflops_per_gpu !== null
    && p.peak_mem_gib !== null);
  const failed = pareto.points.filter((p) => p.kind !== "complete"
    && !["queued", "running"].includes(p.kind));
  const big = complete.length + failed.length > DRAW_MAX;
  // complete trials get most of the budget; each failure kind at most a fifth of it
  const drawn = sample(complete, Math.floor(DRAW_MAX * 0.6), (p) => p.on_front);
  const traces = [{
    type: "scatter", mode: "markers", name: "complete", x: drawn.map((p) => p.tflops_per_gpu),
    y: drawn.map((p) => p.peak_mem_gib), text: drawn.map(pointText), hoverinfo: "x+y+text",
    marker: { size: big ? 5 : 8, color: "#1f77b4", line: { width: big ? 0 : 1, color: "#fff" } },
  }, {
    type: "scatter", mode: "lines", name: "Pareto front",
    x: pareto.front.map((p) => p.tflops_per_gpu), y: pareto.front.map((p) => p.peak_mem_gib),
    line: { shape: "hv", color: "#2ca02c", width: 2 }, hoverinfo: "skip",
  }];
  const groups = {};
  for (const p of failed) (groups[failureGroup(p.kind)] ||= []).push(p);
  let drawnFailed = 0;
  for (const [g, all] of Object.entries(groups)) {
    const st = FAILURE_STYLE[g];
    // no measured throughput: drawn at 0 TFLOP/s; memory: measured, predicted or the cap
    const fx = (p) => p.tflops_per_gpu ?? 0;
    const fy = (p) => p.peak_mem_gib ?? (g === "oom" && memCap ? memCap : 0);
    const pts = big ? sample(all, Math.floor(DRAW_MAX * 0.1)) : all;
    drawnFailed += pts.length;
    traces.push({
      type: "scatter", mode: "markers", name: `${st.name} (${all.length})`,
      x: pts.map(fx), y: pts.map(fy), text: pts.map(pointText), hoverinfo: "text",
      marker: { size: 9, color: st.color, symbol: st.symbol, line: { width: 2, color: st.color } },
    });
  }
  const div = $("#chart-pareto");
  div.dataset.completeCount = String(complete.length);
  div.dataset.failedCount = String(failed.length);
  setNote("#note-pareto", drawn.length + drawnFailed, complete.length + failed.length, "points");
  div.dataset.frontCount = String(pareto.front.length);
  const shapes = memCap ? [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: memCap, y1: memCap,
    line: { color: "#d62728", dash: "dot", width: 1 } }] : [];
  const xmax = Math.max(1, ...complete.map((p) => p.tflops_per_gpu));
  const ymax = Math.max(1, memCap || 0, ...pareto.points.map((p) => p.peak_mem_gib || 0));
  return plot(div, traces, {
    // failures without a measured throughput sit at x = 0, left of the complete trials
    xaxis: { title: { text: "TFLOP/s per GPU" }, range: [-0.06 * xmax, 1.08 * xmax] },
    yaxis: { title: { text: "peak memory (GiB)" }, range: [-0.05 * ymax, 1.1 * ymax] },
    legend: { orientation: "v", x: 1.02, y: 1 },
    margin: { l: 55, r: 10, t: 15, b: 45 },
    shapes,
  });
}

// Parallel coordinates drawn as SVG lines (plotly's parcoords needs WebGL, which is slow or
// missing without a GPU): one axis per knob that varies, the objective last; lines coloured
// by objective quantile, the best drawn on top. Large studies: the best PC_BEST trials plus
// an even sample of the rest, PC_MAX lines in all.
const PC_MAX = 600;
const PC_BEST = 300;
const PC_COLORS = ["#440154", "#3b528b", "#21918c", "#5ec962", "#fde725"];

function pcAxis(label, raw) {
  const numeric = raw.every((v) => typeof v === "number");
  const keys = [...new Set(raw.map((v) => JSON.stringify(v ?? null)))];
  if (numeric && keys.length > 12) { // continuous: min-max
    const lo = Math.min(...raw), hi = Math.max(...raw);
    const span = hi - lo || 1;
    return { label, pos: raw.map((v) => (v - lo) / span),
      ticks: [[0, fmt(lo)], [0.5, fmt(lo + span / 2)], [1, fmt(hi)]] };
  }
  keys.sort(numeric ? (a, b) => Number(a) - Number(b) : undefined);
  const at = (k) => (keys.length === 1 ? 0.5 : keys.indexOf(k) / (keys.length - 1));
  return { label, discrete: true, pos: raw.map((v) => at(JSON.stringify(v ?? null))),
    ticks: keys.map((k) => [at(k), k.replaceAll('"', "")]) };
}

function renderParcoords(study, pareto) {
  const done = pareto.points.filter((p) => p.kind === "complete" && p.value !== null);
  const div = $("#chart-parcoords");
  div.dataset.points = String(done.length);
  if (done.length === 0) {
    if (window.Plotly) window.Plotly.purge(div);
    div.textContent = "no complete trial yet";
    div.dataset.rendered = "true";
    return Promise.resolve();
  }
  if (div.textContent && !div.querySelector(".main-svg")) div.textContent = "";
  const maximize = study.direction === "maximize";
  const ranked = [...done].sort((a, b) => (maximize ? b.value - a.value : a.value - b.value));
  let shown = ranked;
  if (ranked.length > PC_MAX) {
    const rest = ranked.slice(PC_BEST);
    const step = rest.length / (PC_MAX - PC_BEST);
    shown = ranked.slice(0, PC_BEST);
    for (let i = 0; i < PC_MAX - PC_BEST; i++) shown.push(rest[Math.floor(i * step)]);
  }
  div.dataset.lines = String(shown.length);
  const names = [...new Set(shown.flatMap((p) => Object.keys(p.params)))];
  const axes = names.map((n) => pcAxis(n, shown.map((p) => p.params[n] ?? null)))
    .filter((a) => a.ticks.length > 1); // a knob held fixed tells nothing
  axes.push(pcAxis(study.metric, shown.map((p) => p.value)));
  // colour buckets by objective rank among the shown lines (worst first, best on top)
  const order = shown.map((_, i) => i).reverse();
  const buckets = PC_COLORS.map(() => ({ x: [], y: [], text: [] }));
  order.forEach((i, r) => {
    const b = buckets[Math.min(PC_COLORS.length - 1, Math.floor(r * PC_COLORS.length / order.length))];
    // a little deterministic jitter on discrete axes, so that lines sharing a value fan out
    const jitter = ((i * 0.6180339887) % 1 - 0.5) * 0.05;
    axes.forEach((a, k) => { b.x.push(k); b.y.push(a.pos[i] + (a.discrete ? jitter : 0)); });
    b.x.push(null); b.y.push(null);
  });
  const quant = (q) => shown[Math.min(shown.length - 1, Math.floor((1 - q) * shown.length))].value;
  const n = PC_COLORS.length;
  const traces = buckets.map((b, k) => ({
    type: "scatter", mode: "lines", x: b.x, y: b.y, hoverinfo: "skip",
    name: `${fmt(quant(k / n))} – ${fmt(quant(Math.min(k + 1, n - 0.001) / n))}`
      + (k === n - 1 ? " (best)" : ""),
    line: { color: PC_COLORS[k], width: 1 }, opacity: shown.length > 100 ? 0.35 : 0.7,
  })).filter((t) => t.x.length > 0);
  const annotations = [];
  axes.forEach((a, k) => {
    annotations.push({ x: k, y: 1.04, text: `<b>${a.label}</b>`, showarrow: false,
      yanchor: "bottom", font: { size: 11 } });
    for (const [y, t] of a.ticks) {
      annotations.push({ x: k, y, text: t, showarrow: false, xanchor: "right", xshift: -4,
        font: { size: 10, color: "#374151" }, bgcolor: "rgba(255,255,255,0.7)" });
    }
  });
  const shapes = axes.map((_, k) => ({ type: "line", x0: k, x1: k, y0: 0, y1: 1,
    line: { color: "#111827", width: 1.5 } }));
  const caption = shown.length < done.length
    ? `${shown.length} of ${done.length} drawn: the best ${PC_BEST} and an even sample`
    : `${done.length} trials`;
  $("#note-parcoords").textContent = ` (${caption})`;
  return plot(div, traces, {
    height: 380, margin: { l: 70, r: 20, t: 40, b: 30 }, annotations, shapes,
    xaxis: { visible: false, range: [-0.35, axes.length - 0.8] },
    yaxis: { visible: false, range: [-0.05, 1.12] },
    legend: { orientation: "h", x: 0, y: -0.02, yanchor: "top", font: { size: 10 } },
    hovermode: false,
  });
}

async function loadTrial(id) {
  state.trialId = id;
  for (const tr of document.querySelectorAll("#trial-table tbody tr")) {
    tr.classList.toggle("selected", tr.dataset.trialId === String(id));
  }
  const t = await api(`/trials/${id}`);
  const sec = $("#trial-detail");
  sec.hidden = false;
  sec.dataset.trialId = String(t.id);
  $("#detail-number").textContent = String(t.number);
  const st = $("#detail-state");
  st.textContent = t.failure_class ? `${t.state}: ${t.failure_class}` : t.state;
  st.dataset.state = t.state;
  st.className = `state state-${t.state}`;
  $("#detail-reason").textContent = t.reason || "";
  $("#detail-params").textContent = JSON.stringify(
    { params: t.params, metrics: Object.fromEntries(Object.entries(t.metrics)
      .filter(([k]) => k !== "losses")), host: t.host, log: t.log_path }, null, 1);
  const steps = t.steps || [];
  const x = steps.map((s) => s.step);
  await Promise.all([
    plot($("#chart-steps-loss"), [{ type: "scatter", mode: "lines+markers", name: "loss", x,
      y: steps.map((s) => s.loss) }], { height: 240, showlegend: false, xaxis: { title: { text: "step" } } }),
    plot($("#chart-steps-time"), [{ type: "scatter", mode: "lines+markers", name: "step time",
      x, y: steps.map((s) => s.step_time_s), line: { color: "#ff7f0e" } }],
    { height: 240, showlegend: false, xaxis: { title: { text: "step" } },
      yaxis: { title: { text: "s" } } }),
  ]);
  $("#chart-steps-loss").dataset.points = String(steps.length);
}

async function loadTable(name) {
  const q = new URLSearchParams({ limit: PAGE_SIZE, offset: state.offset, order: state.order });
  if (state.filter) q.set("state", state.filter);
  const page = await api(`/studies/${encodeURIComponent(name)}/trials?${q}`);
  if (name === state.study) renderTable(page);
}

async function loadStudy(name, { full }) {
  const enc = encodeURIComponent(name);
  const study = await api(`/studies/${enc}`);
  if (name !== state.study) return;
  renderSummary(study);
  const sig = signatureOf(study);
  if (!full && sig === state.signature) return;
  state.signature = sig;
  const [pareto, rejections] = await Promise.all([
    api(`/studies/${enc}/pareto`),
    api(`/studies/${enc}/rejections?limit=100`),
    loadTable(name),
  ]);
  if (name !== state.study) return;
  renderRejections(rejections);
  await Promise.all([
    renderHistory(study, pareto), renderPareto(study, pareto), renderParcoords(study, pareto),
  ]);
  if (state.trialId !== null && !full) loadTrial(state.trialId).catch(() => {});
  const view = $("#study-view");
  if (view.dataset.rendered !== "true" && !view.dataset.renderMs) {
    // ms from navigation start to the first complete render (read by bench/api_latency.py)
    view.dataset.renderMs = String(Math.round(performance.now()));
  }
  view.dataset.rendered = "true";
}

async function selectStudy(name) {
  if (state.study !== name) {
    state.study = name;
    state.offset = 0;
    state.trialId = null;
    state.signature = null;
    $("#trial-detail").hidden = true;
    for (const id of ["#chart-history", "#chart-pareto", "#chart-parcoords"]) {
      $(id).dataset.rendered = "false";
    }
  }
  history.replaceState(null, "", `#study=${encodeURIComponent(name)}`);
  for (const li of document.querySelectorAll("#study-list li")) {
    li.classList.toggle("selected", li.dataset.study === name);
  }
  $("#empty-view").hidden = true;
  const view = $("#study-view");
  view.hidden = false;
  view.dataset.study = name;
  view.dataset.rendered = "false";
  try {
    await loadStudy(name, { full: true });
  } catch (e) {
    setConn(false, `error: ${e.message}`);
  }
}

// --- polling ------------------------------------------------------------------------------

async function poll() {
  try {
    const studies = await refreshStudies();
    if (state.study) {
      const s = studies.find((x) => x.name === state.study);
      if (s && signatureOf(s) !== state.signature) await loadStudy(state.study, { full: false });
    }
  } catch (e) {
    setConn(false, `offline (${e.message}); retrying`);
  }
  state.timer = setTimeout(poll, state.pollMs);
}

function bindControls() {
  $("#page-prev").addEventListener("click", () => {
    state.offset = Math.max(0, state.offset - PAGE_SIZE);
    loadTable(state.study);
  });
  $("#page-next").addEventListener("click", () => {
    state.offset += PAGE_SIZE;
    loadTable(state.study);
  });
  $("#state-filter").addEventListener("change", (ev) => {
    state.filter = ev.target.value;
    state.offset = 0;
    loadTable(state.study);
  });
  $("#order-select").addEventListener("change", (ev) => {
    state.order = ev.target.value;
    state.offset = 0;
    loadTable(state.study);
  });
}

async function main() {
  bindControls();
  // A study named in the URL starts loading at once, alongside the list and plotly.min.js.
  const m = /^#study=(.+)$/.exec(location.hash);
  const wanted = m ? decodeURIComponent(m[1]) : null;
  const first = wanted ? selectStudy(wanted) : null;
  const [health, listed] = await Promise.allSettled([api("/health"), refreshStudies()]);
  if (health.status === "fulfilled") {
    state.pollMs = Math.max(500, health.value.poll_interval_s * 1000);
  } else {
    setConn(false, `offline (${health.reason.message})`);
  }
  const studies = listed.status === "fulfilled" ? listed.value : [];
  if (listed.status === "rejected") setConn(false, `offline (${listed.reason.message})`);
  if (!wanted && studies.length === 1) await selectStudy(studies[0].name);
  if (first) await first;
  state.timer = setTimeout(poll, state.pollMs);
}

document.addEventListener("DOMContentLoaded", main);
