// dse dashboard: vanilla JS over the REST API (/api/v1), charts with the plotly.min.js the
// app serves from the installed plotly package (never a CDN). No build step.
//
// Stable hooks for tests: #study-list li[data-study], #trial-table tbody tr[data-trial-id],
// badges with data-count / data-value, charts with data-rendered="true" once drawn, and
// #study-view[data-rendered="true"] when the summary, charts and table of the selected study
// are all on screen (data-render-ms: when that first happened, in ms since navigation).
//
// The timeline (/timeline), the loss curves (/losses) and the comparison (/compare) draw
// the data that `dse report` draws too (dse/report/plots.py), in the colours it gives.
"use strict";

const API = "/api/v1";
const PAGE_SIZE = 25; // rows per page of the trials table (a page fits a screen or two)
// Charts are SVG (no WebGL: slow or missing without a GPU). A chart of more than DRAW_MAX
// points draws DRAW_MAX of them: the ones that matter (every new best, the Pareto front)
// and an even sample of the rest, which looks the same at the chart's size; the figure
// caption says how many are drawn.
const DRAW_MAX = 1000;
const FAILURE_STYLE = {
  oom: { name: "OOM", color: "#d62728", symbol: "x" },
  predicted_oom: { name: "predicted OOM (not run)", color: "#ff7f0e", symbol: "triangle-up-open" },
  invalid: { name: "invalid", color: "#7f7f7f", symbol: "square-x-open" },
  pruned: { name: "pruned (stopped early)", color: "#7c3aed", symbol: "circle-open" },
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
  bestTrial: null, // number of the study's best trial (highlighted in the table)
  best: null, // GET /studies/{name}/best of the selected study (null: none yet)
  exportFormat: "megatron",
  timer: null,
  loading: null,
  picked: new Set(), // trial numbers whose losses are drawn over the baseline's
  pickedTouched: false, // the user changed the selection (else: the best trial)
  comparePicks: null, // names of the studies compared with this one (null: all comparable)
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

// Every figure on the page goes through fmt: four significant digits, the rule of
// dse/core/figures.py (the tests check both on the same numbers). Missing is "", zero "0";
// positional from 1e-4 up to 9999.5 with trailing zeros kept ("0.5000", "350.0"), whole
// numbers above ("12350"), "1.234e-5" below.
function fmt(x) {
  if (x === null || x === undefined) return "";
  if (typeof x !== "number") return String(x);
  if (Number.isNaN(x)) return "NaN";
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
  if (x === 0) return "0";
  const sign = x < 0 ? "-" : "";
  const a = Math.abs(x);
  const [mant, exp] = a.toExponential(3).split("e"); // rounded: 9999.7 -> "1.000e+4"
  const e = Number(exp);
  if (e < -4) return `${sign}${mant}e${e}`;
  if (e >= 4) return sign + String(Math.round(Number(a.toPrecision(4))));
  return sign + a.toPrecision(4);
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
  state.bestTrial = s.best_trial;
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
  for (const k of ["complete", "running", "queued", "failed", "infeasible", "pruned"]) {
    setBadge(`#badge-${k}`, c[k] || 0, k);
  }
  $("#badge-pruned").hidden = !c.pruned;
  // issue 15's study figures: shown when the summary carries them
  const saved = $("#badge-gpu-hours-saved");
  const hasSaved = typeof s.gpu_hours_saved === "number";
  saved.hidden = !hasSaved;
  saved.dataset.value = hasSaved ? String(s.gpu_hours_saved) : "";
  if (hasSaved) {
    saved.replaceChildren(el("b", {}, fmt(s.gpu_hours_saved)),
      document.createTextNode(" GPU-hours saved"));
  }
  const busy = $("#badge-gpu-busy");
  const hasBusy = typeof s.gpu_busy_fraction === "number";
  busy.hidden = !hasBusy;
  busy.dataset.value = hasBusy ? String(s.gpu_busy_fraction) : "";
  if (hasBusy) {
    busy.replaceChildren(el("b", {}, `${fmt(100 * s.gpu_busy_fraction)}%`),
      document.createTextNode(" GPU busy"));
  }
  setBadge("#badge-rejections", s.rejections, "rejected before launch");
  const gh = $("#badge-gpu-hours");
  gh.dataset.value = String(s.gpu_hours);
  gh.replaceChildren(el("b", {}, fmt(s.gpu_hours)), document.createTextNode(" GPU-hours"));
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
    const isBest = t.number === state.bestTrial && t.state === "complete";
    // the server's interval of the trial's configuration (dse.results.noise), never one of
    // its own: the same one the best panel, the comparison view and the report show
    const iv = (page.intervals || {})[String(t.number)] || null;

    const num = el("td", {});
    const pick = el("input", { type: "checkbox", class: "pick", title: "draw its losses over the baseline's",
      "data-number": String(t.number), checked: state.picked.has(t.number) });
    pick.addEventListener("click", (ev) => ev.stopPropagation());
    pick.addEventListener("change", () => togglePick(t.number, pick.checked));
    num.append(pick, document.createTextNode(String(t.number)));
    if (isBest) {
      tr.classList.add("best");
      tr.dataset.best = "true";
      tr.title = "the best trial of the study";
      num.append(el("span", { class: "best-mark", title: "best" }, "★"));
    }
    const stateCell = cell(el("span", { class: `state state-${t.state}` }, t.state));
    if (t.remeasure_of !== null && t.remeasure_of !== undefined) {
      tr.dataset.remeasureOf = String(t.remeasure_of);
      stateCell.append(el("span", { class: "flag remeasure", "data-flag": "remeasure",
        title: `runs the configuration of trial ${t.remeasure_of} again (tied within noise `
          + "with the best, or a baseline repeat); pooled with it" }, `re-measures #${t.remeasure_of}`));
    }
    const flag = numericsFlag(m);
    if (flag) {
      stateCell.append(flag);
      tr.dataset.numerics = "changed";
    }
    if (t.source === "estimate") { // the sim workload: every figure of the row, the loss too
      tr.dataset.source = "estimate";
      stateCell.append(el("span", { class: "flag estimate",
        title: "sim workload: figures and losses are cost-model estimates, not measured" },
      "estimate"));
      const trust = m.trust && m.trust.label;
      if (trust) { // how far the estimate is to be trusted (dse/model/costmodel/basis.py)
        tr.dataset.trust = trust;
        const band = m.trust.speed_band == null ? "error band unknown"
          : `speed ±${Math.round(100 * m.trust.speed_band)}%`;
        stateCell.append(el("span", { class: `flag trust trust-${trust}`, "data-flag": "trust",
          title: `${trust} estimate (${band}; basis: ${(m.trust.basis || []).join(", ") || "none"})`
            + (m.trust.why ? `: ${m.trust.why}` : "") }, trust));
      }
    }
    tr.append(
      num,
      stateCell,
      el("td", { class: "num" }, fmt(t.value)),
      withCi(el("td", { class: "num" }, fmt(m.tflops_per_gpu)), ivCi(iv, "tflops_per_gpu"), ivTitle(iv)),
      el("td", { class: "num" }, fmt(m.peak_mem_gib)),
      stepCell(m, ivCi(iv, "step_time_s"), ivTitle(iv)),
      el("td", { class: "num" }, fmt(t.gpu_seconds)),
      el("td", {}, t.failure_class || ""),
      el("td", { class: "reason", title: t.reason || "" }, t.reason || ""),
      paramsCell(t.params),
    );
    tr.addEventListener("click", () => loadTrial(t.id));
    tbody.append(tr);
  }
  const info = $("#page-info");
  info.dataset.count = String(page.count);
  const first = page.count === 0 ? 0 : state.offset + 1;
  info.textContent = `${first}–${state.offset + page.data.length} of ${page.count}`;
  // a study times its steps by one clock (measurement.clock): say so in the column's head
  const cpu = page.data.some((t) => cpuClock(t.metrics));
  const head = $("#th-step");
  head.dataset.clock = cpu ? "cpu" : "";
  head.textContent = cpu ? "CPU s per step" : "step s";
  head.title = cpu ? CPU_CLOCK_TITLE : "";
  $("#page-prev").disabled = state.offset === 0;
  $("#page-next").disabled = state.offset + PAGE_SIZE >= page.count;
  markBestRuns();
}

// measurement.clock cpu (the CPU demo): a trial's step time is the CPU time it spent in a step
// (metrics.step_clock "cpu"), its wall time per step metrics.step_wall_time_s beside it.
const CPU_CLOCK_TITLE = "measurement.clock cpu: each step timed by the CPU time the trial spent "
  + "in it (its wall time also counts waiting for a core); TFLOP/s and tokens/s follow from it";

function cpuClock(m) {
  return Boolean(m) && m.step_clock === "cpu";
}

// "0.2152 s wall" (the trial's median wall time per measured step), or null.
function wallNote(m, suffix = "") {
  const w = m && m.step_wall_time_s;
  if (!cpuClock(m) || w === null || w === undefined) return null;
  return el("span", { class: "wall", "data-wall": String(w),
    title: "wall-clock time per step (median of the measured steps)" }, `${fmt(w)} s wall${suffix}`);
}

// A configuration interval's [lo, hi] of figure k (the server's), or null.
function ivCi(iv, k) {
  const f = iv && iv.figures && iv.figures[k];
  return f && Array.isArray(f.ci) ? f.ci : null;
}

// What a row's interval is: its configuration's, over how many runs, or an estimate's band.
function ivTitle(iv) {
  if (!iv) return "95% interval";
  if (iv.kind === "estimate") {
    return "error band of the estimate (deterministic workload: not re-measured)";
  }
  return `95% interval of its configuration (${iv.n} run${iv.n === 1 ? "" : "s"} pooled; `
    + "step-to-step and run-to-run noise)";
}

// A trials row's step time with its interval; of CPU time, its wall time beside it.
function stepCell(m, ci, title) {
  const td = withCi(el("td", { class: "num" }, fmt(m.step_time_s)), ci, title);
  if (cpuClock(m)) {
    td.dataset.clock = "cpu";
    td.title = "CPU time per step (measurement.clock cpu)";
    const wall = wallNote(m);
    if (wall) td.append(wall);
  }
  return td;
}

// The knobs of a row, at most two lines (the whole list in its tooltip and the trial detail):
// 20-30 knobs made every row five lines tall and a page of 100 rows over 12,000 px.
function paramsCell(params) {
  const text = shortParams(params);
  const td = el("td", { class: "params", title: text });
  td.append(el("div", { class: "clamp" }, text));
  return td;
}

// The other runs of the best configuration (pooled with its first trial) in the table.
function markBestRuns() {
  const runs = new Set(state.best && state.best.noise ? state.best.noise.trials || [] : []);
  for (const tr of document.querySelectorAll("#trial-table tbody tr")) {
    const n = Number(tr.dataset.number);
    const on = runs.has(n) && n !== state.bestTrial && tr.dataset.state === "complete";
    tr.classList.toggle("best-run", on);
    if (on) {
      tr.dataset.bestRun = "true";
      tr.title = `a run of the best configuration (pooled with trial ${state.bestTrial})`;
    } else delete tr.dataset.bestRun;
  }
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

// --- best configuration --------------------------------------------------------------------

const SOURCE_TEXT = {
  measured: "measured",
  replay: "replayed from a measured table",
  estimate: "estimate (cost model, not measured)",
};
const EXPORT_FORMATS = ["megatron", "bridge", "nemo"];
const METRIC_LABEL = {
  tflops_per_gpu: "TFLOP/s per GPU", tokens_per_s_per_gpu: "tokens/s per GPU",
  step_time_s: "step time (s)", peak_mem_gib: "peak memory (GiB)",
  peak_reserved_gib: "reserved (GiB)", loss: "loss",
};

async function loadBest(name) {
  try {
    return await api(`/studies/${encodeURIComponent(name)}/best`);
  } catch (e) {
    if (e.status === 404 || e.status === 409) return null; // no complete trial yet
    throw e;
  }
}

function renderBest(best) {
  state.best = best;
  const panel = $("#best-panel");
  panel.dataset.state = best ? "shown" : "none";
  panel.dataset.trial = best ? String(best.trial) : "";
  $("#best-none").hidden = Boolean(best);
  $("#best-body").hidden = !best;
  const src = $("#best-source");
  src.dataset.source = best ? best.source || "" : "";
  src.textContent = best ? SOURCE_TEXT[best.source] || best.source || "" : "";
  src.className = best && best.source === "measured" ? "state state-complete" : "state";
  const noise = (best && best.noise) || null;
  const runs = noise && noise.trials && noise.trials.length ? noise.trials : best ? [best.trial] : [];
  panel.dataset.runs = runs.join(",");
  $("#best-title").textContent = !best ? "" : runs.length > 1
    ? `trial ${best.trial} · ${runs.length} runs pooled (trials ${runs.join(", ")})`
    : `trial ${best.trial}`;
  renderTie(best);
  // what every interval rests on: the study's noise model, in the server's words
  const nz = $("#best-noise");
  const model = noise && noise.model && noise.kind !== "estimate" ? noise.model.text : "";
  nz.hidden = !model;
  nz.textContent = model ? `95% intervals: step-to-step and ${model}` : "";
  if (!best) return;
  const m = best.metrics || {};
  const obj = best.objective.metric;
  const shown = ["tflops_per_gpu", "step_time_s", "tokens_per_s_per_gpu", "peak_mem_gib",
    "peak_reserved_gib", "loss"];
  // the configuration's pooled figures and intervals (the same everywhere the best is shown)
  const figs = (noise && noise.figures) || {};
  const values = { ...m, [obj]: best.objective.value };
  const cis = {};
  for (const [k, f] of Object.entries(figs)) {
    if (f && f.value !== null && f.value !== undefined) values[k] = f.value;
    if (f && Array.isArray(f.ci)) cis[k] = f.ci;
  }
  const dl = $("#best-metrics");
  dl.replaceChildren();
  const cpu = cpuClock(m);
  for (const k of [obj, ...shown.filter((k) => k !== obj)]) {
    const v = values[k];
    if (v === null || v === undefined) continue;
    const label = k === "step_time_s" && cpu ? "CPU time per step (s)" : METRIC_LABEL[k] || k;
    const div = el("div", { "data-metric": k });
    div.append(el("dt", {}, k === obj ? `${label} (objective)` : label),
      el("dd", { class: k === obj ? "objective" : "", "data-value": String(v) }, fmt(v)));
    const ci = ciText(cis[k]);
    const band = noise && noise.kind === "estimate";
    if (ci) {
      div.append(el("span", { class: "ci", "data-ci": JSON.stringify(cis[k]),
        title: band ? "error band of the estimate (deterministic workload: not re-measured)"
          : "95% interval: step-to-step and run-to-run noise" },
      band ? `estimate ±band ${ci}` : `95% CI ${ci}`));
    }
    if (k === "step_time_s" && cpu) {
      div.dataset.clock = "cpu";
      div.title = CPU_CLOCK_TITLE;
      // the wall time is the best trial's own (the CPU time above is pooled over its runs)
      const wall = wallNote(m, runs.length > 1 ? ` (trial ${best.trial})` : "");
      if (wall) div.append(wall);
    }
    dl.append(div);
  }
  const nf = $("#best-numerics");
  const flag = numericsFlag(m);
  nf.hidden = !flag;
  nf.replaceChildren(...(flag ? [flag] : []));
  $("#best-knobs").textContent = Object.entries(best.params || {})
    .map(([k, v]) => `${k}=${v}`).join("  ");
  for (const f of EXPORT_FORMATS) {
    const tab = document.querySelector(`#best-panel .tab[data-format="${f}"]`);
    tab.disabled = !best.exports || !best.exports[f];
    tab.title = (best.exports && best.exports[`${f}_why`]) || "";
  }
  showExport(state.exportFormat);
  markBestRuns();
}

// "tied within noise: trial A and trial B" with each tied configuration's figure, or hidden
function renderTie(best) {
  const p = $("#best-tie");
  const noise = best && best.noise;
  const tied = (noise && noise.tied) || [];
  p.hidden = !tied.length;
  p.dataset.tied = tied.map((c) => c.trial).join(",");
  p.replaceChildren();
  if (!tied.length) return;
  p.dataset.verdict = noise.verdict || "tied";
  p.dataset.split = noise.split_budget === null || noise.split_budget === undefined
    ? "" : String(noise.split_budget);
  p.append(el("b", {}, noise.message || "tied within noise"),
    document.createTextNode(noise.kind === "estimate"
      ? ". Their error bands overlap the best's; the order among them is not known"
      : ". Their 95% intervals overlap the best's, so the order among them is not known"));
  for (const c of tied) {
    const ci = ciText(c.ci);
    p.append(el("span", { class: "tie", "data-trial": String(c.trial) },
      `trial ${c.trial}: ${fmt(c.value)}${ci ? ` (${ci})` : ""}`
      + (c.trials && c.trials.length > 1 ? `, ${c.trials.length} runs` : "")));
  }
}

// --- issue 15's measurement fields ---------------------------------------------------------


// "lo–hi" of a [lo, hi] interval, or "" when there is none.
function ciText(ci) {
  if (!Array.isArray(ci) || ci.length !== 2 || ci[0] === null || ci[1] === null) return "";
  return `${fmt(ci[0])}–${fmt(ci[1])}`;
}

function withCi(td, ci, title = "95% interval") {
  const text = ciText(ci);
  if (text) {
    td.append(el("div", { class: "ci", title }, text));
    td.dataset.ci = JSON.stringify(ci);
  }
  return td;
}

// The numerics-changed flag (metrics.numerics.status == "changed"), or null.
function numericsFlag(m) {
  const n = m && m.numerics;
  if (!n || n.status !== "changed") return null;
  const why = [n.drift !== null && n.drift !== undefined ? `loss drift ${fmt(n.drift)}` : "",
    n.tolerance !== null && n.tolerance !== undefined ? `tolerance ${fmt(n.tolerance)}` : "",
    n.baseline_trial !== null && n.baseline_trial !== undefined ? `vs trial ${n.baseline_trial}` : ""]
    .filter(Boolean).join(", ");
  return el("span", { class: "flag numerics-changed", "data-flag": "numerics-changed",
    title: `the loss curve differs from the baseline's${why ? ` (${why})` : ""}` }, "numerics changed");
}

function showExport(format) {
  state.exportFormat = format;
  for (const tab of document.querySelectorAll("#best-panel .tab")) {
    tab.setAttribute("aria-selected", String(tab.dataset.format === format));
  }
  const pre = $("#best-export");
  pre.dataset.format = format;
  const text = state.best && state.best.exports ? state.best.exports[format] : null;
  if (text) setArgs(pre, text);
  else {
    const why = state.best && state.best.exports ? state.best.exports[`${format}_why`] : null;
    pre.textContent = why ? `(no export: ${why})` : "(this launcher cannot express the configuration)";
  }
  const copy = $("#copy-export");
  copy.disabled = !text;
  copy.dataset.copied = "false";
  copy.textContent = "Copy";
}

// The launcher text with each argument (a flag and its value: "--micro-batch-size 4", an
// override "model.x=1") kept on one line: the box wraps between arguments, never inside a flag
// at its hyphens. The text itself (what Copy copies) is unchanged: spans and the same spaces.
function setArgs(pre, text) {
  pre.replaceChildren();
  const parts = text.split(/(\s+)/);
  for (let i = 0; i < parts.length; i++) {
    const tok = parts[i];
    if (tok === "") continue;
    if (/^\s+$/.test(tok)) { pre.append(document.createTextNode(tok)); continue; }
    let unit = tok;
    const next = parts[i + 2];
    if (tok.startsWith("-") && next !== undefined && next !== "" && !next.startsWith("-")
        && next !== "\\" && /^ +$/.test(parts[i + 1])) {
      unit = tok + parts[i + 1] + next; // a flag and its value
      i += 2;
    }
    pre.append(el("span", { class: "arg" }, unit));
  }
}

async function copyExport() {
  const text = state.best && state.best.exports ? state.best.exports[state.exportFormat] : null;
  if (!text) return;
  const button = $("#copy-export");
  try {
    await navigator.clipboard.writeText(text); // secure contexts (https, localhost)
  } catch (_) { // plain http on another host: the selection and execCommand
    const range = document.createRange();
    range.selectNodeContents($("#best-export"));
    const sel = window.getSelection();
    sel.removeAllRanges();
    sel.addRange(range);
    document.execCommand("copy");
  }
  button.dataset.copied = "true";
  button.textContent = "Copied";
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
  const figs = [];
  if (p.value !== null) figs.push(`objective ${fmt(p.value)}`);
  if (p.tflops_per_gpu !== null) figs.push(`${fmt(p.tflops_per_gpu)} TFLOP/s/GPU`);
  if (p.peak_mem_gib !== null) {
    figs.push(`${p.source === "rejection" ? "predicted peak" : "peak"} ${fmt(p.peak_mem_gib)} GiB`);
  }
  return `${head} (${p.kind})` + (figs.length ? `<br>${figs.join(", ")}` : "")
    + `<br>${shortParams(p.params)}` + (p.reason ? `<br>${p.reason.slice(0, 160)}` : "");
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
  if (Array.isArray(pareto.best_so_far) && pareto.best_so_far.length) {
    // the noise-aware best so far (pooled configurations; ends at the study's best)
    const byNumber = new Map(done.map((p) => [p.number, p]));
    for (const r of pareto.best_so_far) {
      if (r.value === null || r.value === best) continue;
      best = r.value;
      bestX.push(r.number);
      bestY.push(best);
      if (byNumber.has(r.number)) improved.add(byNumber.get(r.number));
    }
    const last = pareto.best_so_far[pareto.best_so_far.length - 1];
    if (best !== null) { bestX.push(last.number); bestY.push(best); }
  } else {
    for (const p of done) {
      if (best === null || (maximize ? p.value > best : p.value < best)) {
        best = p.value;
        improved.add(p);
        bestX.push(p.number);
        bestY.push(best);
      }
    }
    if (done.length) { bestX.push(done[done.length - 1].number); bestY.push(best); }
  }

  const shownAll = sample(done, DRAW_MAX, (p) => improved.has(p) || p.remeasure_of !== null);
  const again = shownAll.filter((p) => p.remeasure_of !== null && p.remeasure_of !== undefined);
  const shown = shownAll.filter((p) => !again.includes(p));
  const traces = [
    { type: "scatter", mode: "lines", name: "best so far (noise-aware)", x: bestX, y: bestY,
      line: { shape: "hv", color: "#2ca02c", width: 2 }, hoverinfo: "skip" },
    { type: "scatter", mode: "markers", name: "trial", x: shown.map((p) => p.number),
      y: shown.map((p) => p.value), text: shown.map(pointText), hoverinfo: "text",
      marker: { size: shown.length > 500 ? 5 : 8, color: "#1f77b4",
        line: { width: shown.length > 500 ? 0 : 1, color: "#fff" } } },
  ];
  if (again.length) {
    traces.push({ type: "scatter", mode: "markers", name: "re-measure", x: again.map((p) => p.number),
      y: again.map((p) => p.value), text: again.map((p) => `${pointText(p)}<br>re-measures trial ${p.remeasure_of}`),
      hoverinfo: "text", marker: { size: 9, symbol: "diamond-open", color: "#7c3aed", line: { width: 2 } } });
  }
  const div = $("#chart-history");
  div.dataset.points = String(done.length);
  div.dataset.bestLast = best === null ? "" : String(best);
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
    y: drawn.map((p) => p.peak_mem_gib), text: drawn.map(pointText), hoverinfo: "text",
    marker: { size: big ? 5 : 8, color: "#1f77b4", line: { width: big ? 0 : 1, color: "#fff" } },
  }, {
    type: "scatter", mode: "lines", name: "Pareto front",
    x: pareto.front.map((p) => p.tflops_per_gpu), y: pareto.front.map((p) => p.peak_mem_gib),
    line: { shape: "hv", color: "#2ca02c", width: 2 }, hoverinfo: "skip",
  }];
  // The axes fit what the trials measured. A prediction (a rejected configuration's
  // estimated peak) never sets the range, nor does the GPU's memory when every trial stays
  // far below it (the CPU demo): a point above the range is drawn on its top edge as an
  // arrow, and its hover says where it is.
  const measured = pareto.points.filter((p) => p.source === "trial");
  const xs = measured.map((p) => p.tflops_per_gpu).filter((v) => v !== null);
  const xmax = Math.max(0, ...xs) || 1;
  const ys = measured.map((p) => p.peak_mem_gib).filter((v) => v !== null);
  let ytop = Math.max(0, ...ys);
  if (memCap && (ytop === 0 || ytop >= memCap / 4)) ytop = Math.max(ytop, memCap);
  if (ytop === 0) ytop = Math.max(0, ...failed.map((p) => p.peak_mem_gib || 0)) || 1;
  const yclip = 1.06 * ytop; // where points above the range are drawn
  const groups = {};
  for (const p of failed) (groups[failureGroup(p.kind)] ||= []).push(p);
  let drawnFailed = 0;
  let clipped = 0;
  for (const [g, all] of Object.entries(groups)) {
    const st = FAILURE_STYLE[g];
    // no measured throughput: drawn at 0 TFLOP/s; memory: measured, predicted or the cap
    const fx = (p) => p.tflops_per_gpu ?? 0;
    const fy = (p) => p.peak_mem_gib ?? (g === "oom" && memCap ? memCap : 0);
    const pts = big ? sample(all, Math.floor(DRAW_MAX * 0.1)) : all;
    const above = pts.map((p) => fy(p) > yclip);
    const nAbove = above.filter(Boolean).length;
    clipped += nAbove;
    drawnFailed += pts.length;
    traces.push({
      type: "scatter", mode: "markers",
      name: `${st.name} (${all.length}${nAbove ? `; ${nAbove} above the chart ↑` : ""})`,
      x: pts.map(fx), y: pts.map((p, i) => (above[i] ? yclip : fy(p))),
      text: pts.map((p, i) => pointText(p)
        + (above[i] ? `<br>drawn at the top: ${fmt(fy(p))} GiB is above the chart` : "")),
      hoverinfo: "text",
      marker: { size: 9, color: st.color, line: { width: 2, color: st.color },
        symbol: nAbove ? above.map((a) => (a ? "arrow-up" : st.symbol)) : st.symbol },
    });
  }
  const div = $("#chart-pareto");
  div.dataset.completeCount = String(complete.length);
  div.dataset.failedCount = String(failed.length);
  setNote("#note-pareto", drawn.length + drawnFailed, complete.length + failed.length, "points");
  div.dataset.frontCount = String(pareto.front.length);
  div.dataset.clipped = String(clipped);
  const capShown = memCap && memCap <= 1.1 * ytop;
  const shapes = capShown ? [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: memCap,
    y1: memCap, line: { color: "#d62728", dash: "dot", width: 1 } }] : [];
  const annotations = memCap && !capShown ? [{ xref: "paper", yref: "paper", x: 1, y: 1,
    xanchor: "right", yanchor: "top", showarrow: false, font: { size: 10, color: "#6b7280" },
    text: `GPU memory ${fmt(memCap)} GiB (above the chart)` }] : [];
  return plot(div, traces, {
    // failures without a measured throughput sit at x = 0, left of the complete trials
    xaxis: { title: { text: "TFLOP/s per GPU" }, range: [-0.06 * xmax, 1.08 * xmax] },
    yaxis: { title: { text: "peak memory (GiB)" }, range: [-0.05 * ytop, 1.1 * ytop] },
    annotations,
    legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom", font: { size: 11 } },
    margin: { l: 55, r: 10, t: 50, b: 45 },
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

// An axis of knob values (exact) or of figures (`figures`: shown with fmt).
function pcAxis(label, raw, figures = false) {
  const numeric = raw.every((v) => typeof v === "number");
  const keys = [...new Set(raw.map((v) => JSON.stringify(v ?? null)))];
  const show = figures ? fmt : (v) => String(Number(v.toPrecision(4)));
  if (numeric && keys.length > 12) { // continuous: min-max
    const lo = Math.min(...raw), hi = Math.max(...raw);
    const span = hi - lo || 1;
    return { label, pos: raw.map((v) => (v - lo) / span),
      ticks: [[0, show(lo)], [0.5, show(lo + span / 2)], [1, show(hi)]] };
  }
  keys.sort(numeric ? (a, b) => Number(a) - Number(b) : undefined);
  const at = (k) => (keys.length === 1 ? 0.5 : keys.indexOf(k) / (keys.length - 1));
  return { label, discrete: true, pos: raw.map((v) => at(JSON.stringify(v ?? null))),
    ticks: keys.map((k) => [at(k), figures ? fmt(JSON.parse(k)) : k.replaceAll('"', "")]) };
}

// Axis labels that never overlap: horizontal, alternating between two heights, while every
// name fits beside its neighbours on its row; else (many knobs, a narrow chart) upright,
// reading upwards, a name longer than PC_LABEL_MAX px wrapped after an underscore onto as
// many lines as the room between two axes holds (each line kept whole: the label's text is
// the whole name), cut with "…" only past that. The full name is each label's tooltip.
const PC_LABEL_PX = 11;
const PC_LABEL_MAX = 170;
const PC_LABEL_GAP = 8;
const PC_MARGIN_X = 90; // the chart's left and right margins (px)
const PC_RANGE = (n) => [-0.35, n - 0.55];
let pcCanvas = null;
let lastParcoords = null;

function pcTextWidth(text) {
  pcCanvas = pcCanvas || document.createElement("canvas").getContext("2d");
  pcCanvas.font = `bold ${PC_LABEL_PX}px "Open Sans", verdana, arial, sans-serif`;
  return pcCanvas.measureText(text).width;
}

function pcLabels(names, width) {
  const [lo, hi] = PC_RANGE(names.length);
  const step = (width - PC_MARGIN_X) / (hi - lo); // px between two axes
  const widths = names.map(pcTextWidth);
  const edge = (k) => (k - lo) * step; // px from the plot area's left to axis k
  const fits = widths.every((w, k) => (k < 2 || (widths[k - 2] + w) / 2 + PC_LABEL_GAP <= 2 * step)
    && edge(k) >= w / 2 - PC_MARGIN_X / 2);
  if (fits) {
    return { mode: "horizontal", top: 50,
      at: (k) => ({ text: `<b>${names[k]}</b>`, y: k % 2 ? 1.1 : 1.03, yref: "paper",
        yanchor: "bottom" }) };
  }
  const cut = (name) => {
    let n = name.length;
    while (n > 4 && pcTextWidth(`${name.slice(0, n)}…`) > PC_LABEL_MAX) n--;
    return `${name.slice(0, n)}…`;
  };
  // upright lines stand side by side: as many as fit between two axes
  const maxLines = Math.max(1, Math.floor((step - PC_LABEL_GAP) / (PC_LABEL_PX + 3)));
  const wrap = (name, w) => {
    if (w <= PC_LABEL_MAX) return [name];
    const parts = name.split(/(?<=_)/); // after each underscore, the underscore kept
    const lines = [""];
    for (const part of parts) {
      const line = lines[lines.length - 1];
      if (line && pcTextWidth(line + part) > PC_LABEL_MAX) lines.push(part);
      else lines[lines.length - 1] = line + part;
    }
    if (lines.length > maxLines || lines.some((l) => pcTextWidth(l) > PC_LABEL_MAX)) {
      return [cut(name)];
    }
    return lines;
  };
  const wrapped = names.map((n, k) => wrap(n, widths[k]));
  const texts = wrapped.map((lines) => lines.map((l) => `<b>${l}</b>`).join("<br>"));
  const tall = Math.min(PC_LABEL_MAX, Math.max(...wrapped.flat().map(pcTextWidth)));
  return { mode: "upright", top: Math.ceil(tall) + 16,
    at: (k) => ({ text: texts[k], textangle: -90, y: 1, yref: "paper",
      yanchor: "bottom", yshift: 6, align: "left" }) };
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
  axes.push(pcAxis(study.metric, shown.map((p) => p.value), true));
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
  const labels = pcLabels(axes.map((a) => a.label), div.clientWidth || 900);
  div.dataset.labels = labels.mode;
  const annotations = [];
  // a value label sits left of its axis: with many axes it is cut ("…") to the room between
  // two axes, so that it never runs over the previous axis (the whole value is its tooltip)
  const [lo, hi] = PC_RANGE(axes.length);
  const room = Math.max(24, ((div.clientWidth || 900) - PC_MARGIN_X) / (hi - lo) - 10);
  const fit = (t) => {
    if (pcTextWidth(t) * 0.85 <= room) return t;
    let n = t.length;
    while (n > 2 && pcTextWidth(`${t.slice(0, n)}…`) * 0.85 > room) n--;
    return `${t.slice(0, n)}…`;
  };
  let cut = 0;
  axes.forEach((a, k) => {
    annotations.push({ ...labels.at(k), x: k, showarrow: false, name: "pc-label",
      font: { size: PC_LABEL_PX }, hovertext: a.label, hoverlabel: { bgcolor: "#111827" } });
    for (const [y, t] of a.ticks) {
      const text = fit(t);
      if (text !== t) cut++;
      annotations.push({ x: k, y, text, showarrow: false, xanchor: "right", xshift: -4,
        font: { size: 10, color: "#374151" }, bgcolor: "rgba(255,255,255,0.7)",
        hovertext: t, hoverlabel: { bgcolor: "#111827" } });
    }
  });
  div.dataset.cutTicks = String(cut);
  const shapes = axes.map((_, k) => ({ type: "line", x0: k, x1: k, y0: 0, y1: 1,
    line: { color: "#111827", width: 1.5 } }));
  const caption = shown.length < done.length
    ? `${shown.length} of ${done.length} drawn: the best ${PC_BEST} and an even sample`
    : `${done.length} trials`;
  $("#note-parcoords").textContent = ` (${caption})`;
  lastParcoords = [study, pareto];
  return plot(div, traces, {
    height: 350 + labels.top, margin: { l: 70, r: 20, t: labels.top, b: 30 }, annotations, shapes,
    xaxis: { visible: false, range: PC_RANGE(axes.length) },
    yaxis: { visible: false, range: [-0.05, 1.04] },
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
  const metrics = Object.entries(t.metrics).filter(([k]) => k !== "losses")
    .map(([k, v]) => `  ${k}: ${typeof v === "number" ? fmt(v) : JSON.stringify(v)}`);
  $("#detail-params").textContent = `knobs: ${JSON.stringify(t.params, null, 1)}\n`
    + `metrics:\n${metrics.join("\n")}\nhost: ${t.host || ""}\nlog: ${t.log_path || ""}`;
  const steps = t.steps || [];
  const x = steps.map((s) => s.step);
  const simulated = t.source === "estimate";
  const cpu = cpuClock(t.metrics);
  $("#chart-steps-time").dataset.clock = cpu ? "cpu" : "";
  $("#caption-steps-time").textContent = cpu ? "CPU time per step (s; measurement.clock cpu)"
    : "Step time per step";
  $("#chart-steps-loss").dataset.source = t.source || "";
  $("#note-steps-loss").textContent = simulated ? SIMULATED_LOSS_NOTE : "";
  await Promise.all([
    plot($("#chart-steps-loss"), [{ type: "scatter", mode: "lines+markers",
      name: simulated ? "loss (simulated)" : "loss", x,
      y: steps.map((s) => s.loss) }], { height: 240, showlegend: false, xaxis: { title: { text: "step" } } }),
    plot($("#chart-steps-time"), [{ type: "scatter", mode: "lines+markers",
      name: cpu ? "CPU time per step" : "step time",
      x, y: steps.map((s) => s.step_time_s), line: { color: "#ff7f0e" } }],
    { height: 240, showlegend: false, xaxis: { title: { text: "step" } },
      yaxis: { title: { text: cpu ? "CPU s" : "s" } } }),
  ]);
  $("#chart-steps-loss").dataset.points = String(steps.length);
}

// Knob importance and slices: /insights, the data `dse report` draws (dse/report/plots.py).
// Knob importance and slices, designed for the 20-30 knobs of a real recipe: one bar row per
// knob (every label drawn, the chart as tall as its knobs need, the margin as wide as the
// longest name) and the slices as small multiples, wrapped into as many rows as needed, each
// with its own title and tilted category labels.
const SLICE_W = 250; // px per small multiple
const SLICE_H = 170; // px per row of them
const BAR_H = 20; // px per importance bar

async function renderInsights(study, ins) {
  const imp = ins.importance || {};
  const names = Object.keys(imp).reverse();
  const idiv = $("#chart-importance");
  idiv.dataset.knobs = Object.keys(imp).join(",");
  $("#note-importance").textContent = ` (${ins.importance_how})`;
  const longest = Math.max(60, ...names.map((n) => pcTextWidth(n)));
  const ih = Math.max(240, names.length * BAR_H + 70);
  idiv.style.height = `${ih}px`;
  const pending = [plot(idiv, [{
    type: "bar", orientation: "h", y: names, x: names.map((n) => imp[n]),
    text: names.map((n) => fmt(imp[n])), hoverinfo: "y+text", textposition: "auto",
  }], { height: ih, xaxis: { title: { text: "importance (PED-ANOVA)" } },
    yaxis: { tickmode: "array", tickvals: names, ticktext: names, automargin: true,
      tickfont: { size: 11 } },
    margin: { l: Math.min(320, Math.ceil(longest) + 16), r: 15, t: 20, b: 45 } })];
  const knobs = Object.keys(ins.slices);
  const sdiv = $("#chart-slices");
  sdiv.dataset.knobs = knobs.join(",");
  const width = sdiv.clientWidth || 900;
  const cols = Math.max(1, Math.min(knobs.length, Math.floor(width / SLICE_W)));
  const rows = Math.max(1, Math.ceil(knobs.length / cols));
  sdiv.dataset.columns = String(cols);
  sdiv.dataset.rows = String(rows);
  const traces = knobs.map((k, i) => ({
    type: "scatter", mode: "markers", name: k, xaxis: i ? `x${i + 1}` : "x",
    yaxis: i ? `y${i + 1}` : "y", marker: { size: 6, opacity: 0.75 },
    x: ins.slices[k].map((r) => String(r.x)), y: ins.slices[k].map((r) => r.value),
    text: ins.slices[k].map((r) => `trial ${r.number}: ${k}=${r.x}, ${fmt(r.value)}`),
    hoverinfo: "text",
  }));
  const sh = rows * SLICE_H + 50;
  sdiv.style.height = `${sh}px`;
  const layout = { height: sh, showlegend: false, margin: { l: 55, r: 10, t: 24, b: 30 },
    grid: { rows, columns: cols, pattern: "independent", xgap: 0.12, ygap: 0.55 },
    annotations: [] };
  knobs.forEach((k, i) => {
    const sx = i ? `${i + 1}` : "";
    layout[`xaxis${sx}`] = { type: "category", categoryorder: "array",
      categoryarray: ins.slice_values[k], tickangle: -25, tickfont: { size: 9 }, automargin: false };
    const y = { tickfont: { size: 9 } };
    if (i) y.matches = "y"; // one objective scale across the multiples
    if (i % cols === 0) y.title = { text: study.metric, font: { size: 10 } };
    layout[`yaxis${sx}`] = y;
    layout.annotations.push({ text: `<b>${k}</b>`, xref: `x${sx} domain`, yref: `y${sx} domain`,
      x: 0.5, y: 1.02, xanchor: "center", yanchor: "bottom", showarrow: false,
      font: { size: 10 } });
  });
  pending.push(plot(sdiv, traces, layout));
  await Promise.all(pending);
}

// --- timeline of trials per GPU slot (/timeline) -------------------------------------------

function renderTimeline(tl) {
  const div = $("#chart-timeline");
  const lanes = tl.lanes.map((l) => l.label);
  div.dataset.lanes = String(lanes.length);
  div.dataset.laneLabels = JSON.stringify(lanes);
  div.dataset.bars = String(tl.bars.length);
  div.dataset.gaps = String(tl.gaps.length);
  div.dataset.slotsFrom = tl.slots_from.join(",");
  const busy = tl.busy_fraction === null ? "" : `; slots busy ${fmt(100 * tl.busy_fraction)}% of the time`;
  const cut = tl.trials_shown < tl.trials_ran
    ? `; the latest ${tl.trials_shown} of ${tl.trials_ran} trials` : "";
  $("#note-timeline").textContent = ` (${tl.label}${busy}${cut})`;
  if (lanes.length === 0) {
    if (window.Plotly) window.Plotly.purge(div);
    div.textContent = "no trial has started yet";
    div.dataset.rendered = "true";
    return Promise.resolve();
  }
  if (div.textContent && !div.querySelector(".main-svg")) div.textContent = "";
  const k = tl.scale;
  const when = (sec) => new Date((tl.t0 + sec) * 1000).toLocaleString();
  const traces = [];
  if (tl.gaps.length) {
    traces.push({ type: "bar", orientation: "h", name: "idle", y: tl.gaps.map((g) => g.lane),
      base: tl.gaps.map((g) => g.start / k), x: tl.gaps.map((g) => g.duration_s / k),
      marker: { color: tl.colors.idle, line: { color: "#9ca3af", width: 1 } },
      text: tl.gaps.map((g) => `idle ${fmt(g.duration_s)} s<br>${when(g.start)} – ${when(g.end)}`),
      hoverinfo: "text", textposition: "none" });
  }
  const states = [...new Set(tl.bars.map((b) => b.state))];
  for (const st of states) {
    const bars = tl.bars.filter((b) => b.state === st);
    traces.push({ type: "bar", orientation: "h", name: st, y: bars.map((b) => b.lane),
      base: bars.map((b) => b.start / k), x: bars.map((b) => b.duration_s / k),
      marker: { color: tl.colors[st] || "#6b7280", line: { color: "#fff", width: 1 } },
      text: bars.map((b) => `trial ${b.trial} (${b.state}${b.failure_class ? `: ${b.failure_class}` : ""})`
        + `<br>${b.lane}: ${when(b.start)}, ${fmt(b.duration_s)} s${b.open ? " so far" : ""}`
        + (b.value !== null ? `<br>objective ${fmt(b.value)}` : "")
        + (b.reason ? `<br>${b.reason.slice(0, 160)}` : "")),
      hoverinfo: "text", textposition: "none" });
  }
  const ticks = tl.lanes.map((l) => (l.busy_fraction === null ? l.label
    : `${l.label} (${fmt(100 * l.busy_fraction)}%)`));
  return plot(div, traces, {
    barmode: "overlay", bargap: 0.25,
    height: Math.min(900, 110 + 30 * lanes.length),
    xaxis: { title: { text: `time since the first start (${tl.unit})` }, rangemode: "tozero" },
    yaxis: { type: "category", categoryorder: "array", categoryarray: lanes, autorange: "reversed",
      tickvals: lanes, ticktext: ticks, automargin: true, tickfont: { size: 11 } },
    margin: { l: 130, r: 15, t: 40, b: 45 },
    legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom", font: { size: 11 } },
  });
}

// --- loss curves of the selected trials over the baseline's (/losses) -----------------------

// The sim workload's losses are a curve of the training's definition, not a training run.
const SIMULATED_LOSS_NOTE = " · simulated (sim workload: cost model, not trained)";

async function loadLosses(name) {
  const q = new URLSearchParams();
  for (const n of [...state.picked].sort((a, b) => a - b)) q.append("trials", String(n));
  const data = await api(`/studies/${encodeURIComponent(name)}/losses?${q}`);
  if (name === state.study) await renderLosses(data);
}

function renderLosses(data) {
  const div = $("#chart-losses");
  div.dataset.traces = String(data.curves.length);
  div.dataset.baseline = data.baseline === null ? "" : String(data.baseline);
  div.dataset.trials = data.curves.filter((c) => !c.baseline).map((c) => c.number).join(",");
  $("#losses-picked").textContent = state.picked.size
    ? `trials ${[...state.picked].sort((a, b) => a - b).join(", ")}` : "no trial ticked";
  const simulated = data.curves.some((c) => c.source === "estimate");
  div.dataset.simulated = String(simulated);
  $("#note-losses").textContent = (data.baseline === null
    ? ` (${data.baseline_how}: ${shortParams(data.baseline_params)})`
    : ` (baseline: trial ${data.baseline}, ${data.baseline_how}; ${shortParams(data.baseline_params)})`)
    + (simulated ? SIMULATED_LOSS_NOTE : "");
  if (data.curves.length === 0) {
    if (window.Plotly) window.Plotly.purge(div);
    div.textContent = "tick trials in the table to draw their losses";
    div.dataset.rendered = "true";
    return Promise.resolve();
  }
  if (div.textContent && !div.querySelector(".main-svg")) div.textContent = "";
  const traces = data.curves.map((c) => {
    const changed = c.numerics === "changed";
    const sim = c.source === "estimate" ? " · simulated" : "";
    const name = c.baseline ? `baseline (trial ${c.number})${sim}`
      : `trial ${c.number}${changed ? " · numerics changed" : ""}${sim}`;
    const trace = { type: "scatter", mode: c.steps.length > 40 ? "lines" : "lines+markers", name,
      x: c.steps, y: c.loss, text: c.steps.map(() => `${name}<br>${shortParams(c.params)}`),
      hovertemplate: "%{text}<br>step %{x}: loss %{y:.4g}<extra></extra>",
      line: { width: 2 }, marker: { size: 5 } };
    if (c.baseline) {
      trace.line = { color: data.colors.baseline, width: 4, dash: "dash" };
      trace.marker = { size: 6, color: data.colors.baseline };
    } else if (changed) {
      trace.line = { width: 2, dash: "dot" };
    }
    return trace;
  });
  return plot(div, traces, {
    height: 320, xaxis: { title: { text: "step" }, tickformat: "d" },
    yaxis: { title: { text: "loss" } },
  });
}

function togglePick(number, on) {
  state.pickedTouched = true;
  if (on) state.picked.add(number); else state.picked.delete(number);
  for (const box of document.querySelectorAll(`#trial-table input.pick[data-number="${number}"]`)) {
    box.checked = on;
  }
  loadLosses(state.study).catch((e) => setConn(false, `losses: ${e.message}`));
}

// --- the studies of this model on other hardware or recipes (/comparable, /compare) ---------

function hwText(r) {
  return `${r.gpu || r.device || "?"} ×${r.world_size ?? "?"}`;
}

function renderComparePicks(comparable) {
  const box = $("#compare-picks");
  box.replaceChildren();
  box.dataset.count = String(comparable.data.length);
  $("#compare-none").hidden = comparable.data.length > 0;
  for (const r of comparable.data) {
    const on = state.comparePicks === null || state.comparePicks.has(r.study);
    const input = el("input", { type: "checkbox", checked: on, "data-study": r.study });
    input.addEventListener("change", () => {
      if (state.comparePicks === null) state.comparePicks = new Set(comparable.data.map((x) => x.study));
      if (input.checked) state.comparePicks.add(r.study); else state.comparePicks.delete(r.study);
      loadCompare(state.study, comparable).catch((e) => setConn(false, `compare: ${e.message}`));
    });
    const label = el("label", { class: "pick-study" });
    label.append(input, document.createTextNode(` ${r.study} `),
      el("span", { class: "muted small" }, `${hwText(r)}${r.recipe ? ` · ${r.recipe}` : ""}`));
    box.append(label);
  }
}

async function loadCompare(name, comparable) {
  const others = comparable.data.map((r) => r.study)
    .filter((n) => state.comparePicks === null || state.comparePicks.has(n));
  if (others.length === 0) {
    renderCompare(null);
    return;
  }
  const q = new URLSearchParams();
  for (const n of [name, ...others]) q.append("studies", n);
  const data = await api(`/compare?${q}`);
  if (name === state.study) await renderCompare(data);
}

function renderCompare(data) {
  const tbody = $("#compare-table tbody");
  tbody.replaceChildren();
  const div = $("#chart-compare");
  div.dataset.studies = data ? data.studies.map((r) => r.study).join(",") : "";
  $("#compare-body").hidden = !data;
  if (!data) {
    div.dataset.rendered = "true";
    return Promise.resolve();
  }
  $("#compare-model").textContent = `model: ${data.model.num_layers} layers, h=${data.model.hidden_size}, `
    + `${data.model.num_attention_heads} heads` + (data.model.num_moe_experts ? `, ${data.model.num_moe_experts} experts` : "");
  $("#note-compare").textContent = ` (${data.label})`;
  for (const r of data.studies) {
    const b = r.best || {};
    const tr = el("tr", { "data-study": r.study, "data-best-trial": r.best ? String(b.trial) : "" });
    if (r.study === state.study) tr.classList.add("selected");
    const link = el("a", { href: `#study=${encodeURIComponent(r.study)}` }, r.study);
    const figure = (k, ci) => {
      const td = el("td", { class: "num", "data-metric": k }, fmt(b[k] ?? null));
      if (k === "step_time_s" && cpuClock(b)) { // CPU time: say so, its wall time beside it
        td.dataset.clock = "cpu";
        td.title = "CPU time per step (measurement.clock cpu)";
        td.append(el("span", { class: "wall" }, "CPU time"));
        withCi(td, b[ci]);
        const wall = wallNote(b);
        if (wall) td.append(wall);
        return td;
      }
      return ci ? withCi(td, b[ci]) : td;
    };
    tr.append(cell(link), el("td", {}, hwText(r)),
      el("td", {}, r.recipe || (r.workload ? `${r.workload} workload` : "")),
      el("td", { class: "num" }, `${r.seq_length ?? ""} · ${r.global_batch_size ?? ""}`),
      el("td", { class: "num", "data-source": b.source || "" },
        r.best ? String(b.trial) + (b.source === "estimate" ? " (estimate)" : "")
          + (b.trials && b.trials.length > 1 ? ` · ${b.trials.length} runs` : "")
          + (b.tied && b.tied.length ? ` · tied with ${b.tied.join(", ")}` : "") : "–"),
      figure("tflops_per_gpu", "tflops_per_gpu_ci"), figure("step_time_s", "step_time_ci_s"),
      figure("peak_mem_gib"), el("td", { class: "num" }, fmt(r.gpu_hours)),
      el("td", { class: "params" }, r.best ? shortParams(b.params) : "no complete trial"));
    if (b.numerics === "changed") tr.children[4].append(numericsFlag({ numerics: { status: "changed" } }));
    tbody.append(tr);
  }
  const names = data.studies.map((r) => `${r.study}<br>${hwText(r)}`);
  const err = (k, ci) => {
    const has = data.studies.some((r) => r.best && Array.isArray(r.best[ci]));
    if (!has) return undefined;
    return { type: "data", symmetric: false, color: "#111827", thickness: 1.5,
      array: data.studies.map((r) => (r.best && r.best[ci] ? r.best[ci][1] - r.best[k] : null)),
      arrayminus: data.studies.map((r) => (r.best && r.best[ci] ? r.best[k] - r.best[ci][0] : null)) };
  };
  const colors = data.studies.map((r) => (r.study === state.study ? "#2563eb" : "#94a3b8"));
  const bar = (k, ci, axis) => ({ type: "bar", name: data.figures[k], x: names,
    y: data.studies.map((r) => (r.best ? r.best[k] : null)), xaxis: `x${axis}`, yaxis: `y${axis}`,
    marker: { color: colors }, error_y: err(k, ci),
    text: data.studies.map((r) => (r.best ? fmt(r.best[k]) : "")), textposition: "outside",
    hoverinfo: "x+text", cliponaxis: false });
  return plot(div, [bar("tflops_per_gpu", "tflops_per_gpu_ci", ""), bar("step_time_s", "step_time_ci_s", 2)], {
    grid: { rows: 1, columns: 2, pattern: "independent" }, showlegend: false, height: 340,
    yaxis: { title: { text: data.figures.tflops_per_gpu }, rangemode: "tozero" },
    yaxis2: { title: { text: data.figures.step_time_s }, rangemode: "tozero" },
    xaxis: { tickfont: { size: 10 } }, xaxis2: { tickfont: { size: 10 } },
    margin: { l: 60, r: 15, t: 30, b: 70 },
  });
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
  if (!state.pickedTouched) { // until the user ticks trials: the best one
    state.picked = new Set(study.best_trial === null ? [] : [study.best_trial]);
  }
  // the decision views load and draw on their own, alongside the rest; the timeline draws
  // a bar per GPU a trial held: at most DRAW_MAX bars (the latest trials)
  const perTrial = (study.hardware && study.hardware.world_size) || 1;
  const last = Math.max(50, Math.floor(DRAW_MAX / perTrial));
  const views = Promise.all([
    api(`/studies/${enc}/timeline?last=${last}`)
      .then((tl) => (name === state.study ? renderTimeline(tl) : null)),
    loadLosses(name),
    api(`/studies/${enc}/comparable`).then((c) => {
      if (name !== state.study) return null;
      renderComparePicks(c);
      return loadCompare(name, c);
    }),
  ]);
  const [pareto, rejections, best, insights] = await Promise.all([
    api(`/studies/${enc}/pareto`),
    api(`/studies/${enc}/rejections?limit=100`),
    study.best_trial === null ? null : loadBest(name), // no 404 while there is none
    loadTable(name).then(() => null),
    api(`/studies/${enc}/insights`).catch(() => null),
  ]).then(([p, r, b, _t, i]) => [p, r, b, i]);
  if (name !== state.study) return;
  renderBest(best);
  renderRejections(rejections);
  await Promise.all([
    renderHistory(study, pareto), renderPareto(study, pareto), renderParcoords(study, pareto),
    insights === null ? null : renderInsights(study, insights), views,
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
    state.bestTrial = null;
    state.picked = new Set();
    state.pickedTouched = false;
    state.comparePicks = null;
    renderBest(null);
    $("#trial-detail").hidden = true;
    for (const id of ["#chart-history", "#chart-pareto", "#chart-parcoords", "#chart-importance",
      "#chart-slices", "#chart-timeline", "#chart-losses", "#chart-compare"]) {
      $(id).dataset.rendered = "false";
    }
  }
  if (studyInHash() !== name) history.replaceState(null, "", `#study=${encodeURIComponent(name)}`);
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

function studyInHash() {
  const m = /^#study=(.+)$/.exec(location.hash);
  return m ? decodeURIComponent(m[1]) : null;
}

function bindControls() {
  // the parallel coordinates' labels are laid out for the chart's width: again after a resize
  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      if (lastParcoords && lastParcoords[0].name === state.study) renderParcoords(...lastParcoords);
    }, 200);
  });
  // a study named in the URL (typed, pasted, back/forward) is the one shown
  window.addEventListener("hashchange", () => {
    const wanted = studyInHash();
    if (wanted && wanted !== state.study) selectStudy(wanted);
  });
  for (const tab of document.querySelectorAll("#best-panel .tab")) {
    tab.addEventListener("click", () => showExport(tab.dataset.format));
  }
  $("#copy-export").addEventListener("click", () => {
    copyExport().catch((e) => setConn(false, `copy failed: ${e.message}`));
  });
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
  $("#losses-clear").addEventListener("click", () => {
    state.pickedTouched = true;
    state.picked = new Set();
    for (const box of document.querySelectorAll("#trial-table input.pick")) box.checked = false;
    loadLosses(state.study).catch((e) => setConn(false, `losses: ${e.message}`));
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
  const wanted = studyInHash();
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
