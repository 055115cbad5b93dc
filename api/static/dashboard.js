// dse dashboard: vanilla JS over the REST API (/api/v1), charts with the plotly.min.js the
// app serves from the installed plotly package (never a CDN). No build step.
//
// Stable hooks for tests: #study-list li[data-study], #trial-table tbody tr[data-trial-id],
// badges with data-count / data-value, charts with data-rendered="true" once drawn, and
// #study-view[data-rendered="true"] when the summary, charts and table of the selected study
// are all on screen.
"use strict";

const API = "/api/v1";
const PAGE_SIZE = 100;
const GL_THRESHOLD = 2000; // above this many points, WebGL traces
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

async function api(path) {
  const r = await fetch(API + path, { headers: { Accept: "application/json" } });
  if (!r.ok) {
    let detail = r.statusText;
    try { detail = (await r.json()).detail; } catch (_) { /* not JSON */ }
    const err = new Error(`${r.status}: ${detail}`);
    err.status = r.status;
    throw err;
  }
  return r.json();
}

function setConn(ok, text) {
  const c = $("#conn-status");
  c.dataset.state = ok ? "ok" : "error";
  c.textContent = text;
}

// plotly.min.js is ~4.8 MB: load it in parallel with the first API calls.
const plotlyReady = new Promise((resolve) => {
  const s = document.createElement("script");
  s.src = "/static/vendor/plotly.min.js";
  s.onload = () => resolve(window.Plotly || null);
  s.onerror = () => resolve(null);
  document.head.appendChild(s);
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
    div.textContent = "charts unavailable: plotly is not installed on the server (dse[api])";
    div.dataset.rendered = "unavailable";
    return;
  }
  await Plotly.react(div, traces, { ...LAYOUT, ...layout }, CONFIG);
  div.dataset.rendered = "true";
}

function renderHistory(study, pareto) {
  const done = pareto.points.filter((p) => p.source === "trial" && p.value !== null);
  const gl = done.length > GL_THRESHOLD ? "scattergl" : "scatter";
  const maximize = study.direction === "maximize";
  const bestX = [], bestY = [];
  let best = null;
  for (const p of done) {
    if (best === null || (maximize ? p.value > best : p.value < best)) best = p.value;
    bestX.push(p.number);
    bestY.push(best);
  }
  const traces = [
    { type: gl, mode: "lines", name: "best so far", x: bestX, y: bestY,
      line: { shape: "hv", color: "#2ca02c", width: 2 }, hoverinfo: "skip" },
    { type: gl, mode: "markers", name: "trial", x: done.map((p) => p.number),
      y: done.map((p) => p.value), text: done.map(pointText), hoverinfo: "x+y+text",
      marker: { size: 8, color: "#1f77b4", line: { width: 1, color: "#fff" } } },
  ];
  const div = $("#chart-history");
  div.dataset.points = String(done.length);
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
  const gl = complete.length + failed.length > GL_THRESHOLD ? "scattergl" : "scatter";
  const traces = [{
    type: gl, mode: "markers", name: "complete", x: complete.map((p) => p.tflops_per_gpu),
    y: complete.map((p) => p.peak_mem_gib), text: complete.map(pointText),
    hoverinfo: "x+y+text", marker: { size: 8, color: "#1f77b4", line: { width: 1, color: "#fff" } },
  }, {
    type: "scatter", mode: "lines", name: "Pareto front",
    x: pareto.front.map((p) => p.tflops_per_gpu), y: pareto.front.map((p) => p.peak_mem_gib),
    line: { shape: "hv", color: "#2ca02c", width: 2 }, hoverinfo: "skip",
  }];
  const groups = {};
  for (const p of failed) (groups[failureGroup(p.kind)] ||= []).push(p);
  for (const [g, pts] of Object.entries(groups)) {
    const st = FAILURE_STYLE[g];
    traces.push({
      type: gl, mode: "markers", name: `${st.name} (${pts.length})`,
      // no measured throughput: drawn at 0 TFLOP/s; memory: measured, predicted or the cap
      x: pts.map((p) => p.tflops_per_gpu ?? 0),
      y: pts.map((p) => p.peak_mem_gib ?? (g === "oom" && memCap ? memCap : 0)),
      text: pts.map(pointText), hoverinfo: "text",
      marker: { size: 9, color: st.color, symbol: st.symbol, line: { width: 2, color: st.color } },
    });
  }
  const div = $("#chart-pareto");
  div.dataset.completeCount = String(complete.length);
  div.dataset.failedCount = String(failed.length);
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
  const names = [...new Set(done.flatMap((p) => Object.keys(p.params)))];
  const dims = [];
  for (const n of names) {
    const vals = done.map((p) => p.params[n]);
    const distinct = [...new Set(vals.map((v) => JSON.stringify(v ?? null)))];
    if (distinct.length < 2) continue; // a fixed knob tells nothing
    if (vals.every((v) => typeof v === "number")) {
      dims.push({ label: n, values: vals });
    } else {
      distinct.sort();
      dims.push({ label: n, values: vals.map((v) => distinct.indexOf(JSON.stringify(v ?? null))),
        tickvals: distinct.map((_, i) => i), ticktext: distinct.map((d) => d.replaceAll('"', "")) });
    }
  }
  dims.push({ label: study.metric, values: done.map((p) => p.value) });
  const traces = [{
    type: "parcoords", dimensions: dims,
    line: { color: done.map((p) => p.value), colorscale: "Viridis", showscale: true,
      reversescale: study.direction === "minimize" },
  }];
  return plot(div, traces, { height: 360, margin: { l: 60, r: 60, t: 40, b: 20 } });
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
  $("#study-view").dataset.rendered = "true";
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
  try {
    const health = await api("/health");
    state.pollMs = Math.max(500, health.poll_interval_s * 1000);
  } catch (e) {
    setConn(false, `offline (${e.message})`);
  }
  let studies = [];
  try {
    studies = await refreshStudies();
  } catch (e) {
    setConn(false, `offline (${e.message})`);
  }
  const m = /^#study=(.+)$/.exec(location.hash);
  const wanted = m ? decodeURIComponent(m[1]) : (studies.length === 1 ? studies[0].name : null);
  if (wanted && studies.some((s) => s.name === wanted)) await selectStudy(wanted);
  state.timer = setTimeout(poll, state.pollMs);
}

document.addEventListener("DOMContentLoaded", main);
