// The dstreams status page: polls the JSON API every REFRESH_MS and redraws; no libraries, no network
// access beyond the server that served it. Endpoints and fields: docs/guide/monitoring.md.
"use strict";

const REFRESH_MS = 2000;
const TABLE_ROWS = 30;
const SVG = "http://www.w3.org/2000/svg";

let batches = [];          // completed batches of the timeline, oldest first
let timelineMs = 600000;
let batchIntervalMs = null;
const jobsByBatch = new Map();  // batch time -> [{id, url}] (a completed batch's jobs do not change)
const jobsPending = new Set();

function $(id) { return document.getElementById(id); }
function fmtInt(v) { return v === null || v === undefined ? "–" : Number(v).toLocaleString("en-US"); }
function fmtMs(v) { return v === null || v === undefined ? "–" : fmtInt(Math.round(v)); }
function fmtCompact(v) {
  const units = [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
  for (const [size, unit] of units) if (Math.abs(v) >= size) return `${+(v / size).toFixed(1)}${unit}`;
  return String(+v.toFixed(1));
}
function fmtDuration(ms) {
  if (ms === null || ms === undefined) return "–";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 120000) return `${(ms / 1000).toFixed(1)} s`;
  if (ms < 7200000) return `${(ms / 60000).toFixed(1)} min`;
  return `${(ms / 3600000).toFixed(1)} h`;
}
function fmtBytes(b) {
  if (b === null || b === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0; let v = b;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return i === 0 ? `${b} B` : `${v.toFixed(1)} ${units[i]}`;
}
function pad(n, w = 2) { return String(n).padStart(w, "0"); }
function fmtTime(ms) {
  const d = new Date(ms);
  const day = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}`;
  return `${day} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}
function el(tag, attrs = {}, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}
function svgEl(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}
async function getJSON(url) {
  const response = await fetch(url, { cache: "no-store" });
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  return response.json();
}

// ------------------------------------------------------------------ header, totals, sources, state, errors
function renderStatus(s) {
  const app = s.app;
  document.title = `dstreams · ${app.app_name}`;
  $("app-name").textContent = app.app_name;
  $("state").textContent = app.state;
  $("state").className = `badge ${app.state}`;
  batchIntervalMs = app.batch_interval_ms;
  timelineMs = s.timeline_ms || timelineMs;
  $("batch-interval").textContent = fmtDuration(app.batch_interval_ms);
  $("master").textContent = app.master || "–";
  const d = s.driver;
  $("epoch").textContent = d.epoch === null ? "– (no metadata log)" : `${d.epoch}${d.fenced ? " (FENCED)" : ""}`;
  $("checkpoint-location").textContent = d.checkpoint_location + (d.checkpoint_location_temporary ? " (temporary)" : "");
  const ui = $("spark-ui");
  ui.textContent = "";
  if (app.spark_ui_url) ui.appendChild(el("a", { href: app.spark_ui_url }, app.spark_ui_url));
  else ui.textContent = "disabled (spark.ui.enabled=false)";

  const t = s.totals;
  $("total-completed").textContent = fmtInt(t.batches_completed);
  $("total-failed").textContent = fmtInt(t.batches_failed);
  $("total-dropped").textContent = fmtInt(t.batches_dropped);
  $("total-pending").textContent = fmtInt(t.batches_pending);
  $("total-records").textContent = fmtInt(t.input_records);

  const sources = $("sources").tBodies[0];
  sources.textContent = "";
  for (const src of s.sources) {
    const row = el("tr", { "data-source": src.key });
    row.appendChild(el("td", { title: src.type }, src.name));
    row.appendChild(el("td", { class: "num" }, src.rate_per_s === null ? "–" : fmtInt(Math.round(src.rate_per_s))));
    row.appendChild(el("td", { class: "num" }, fmtInt(src.records_total)));
    row.appendChild(el("td", { class: "num", title: "offsets skipped as gone from the server (failOnDataLoss=False)" },
      fmtInt(src.records_lost)));
    sources.appendChild(row);
  }

  const state = $("state-table").tBodies[0];
  state.textContent = "";
  for (const n of s.streams.nodes) {
    if (!n.state) continue;
    const st = n.state;
    const row = el("tr", { "data-stream": n.key });
    row.appendChild(el("td", {}, n.name));
    const kept = st.kept_in === "executor" ? "executor store" : "RDD";
    row.appendChild(el("td", { class: "kept-in" }, st.picked_by_size
      ? kept + " (auto" + (st.moved_at_ms === null ? ")" : ", since " + fmtTime(st.moved_at_ms) + ")") : kept));
    row.appendChild(el("td", { class: "num" }, fmtInt(st.keys)));
    row.appendChild(el("td", { class: "num" }, fmtBytes(st.bytes)));
    row.appendChild(el("td", { class: "num" }, st.newest_checkpoint_ms === null ? "none yet" : fmtTime(st.newest_checkpoint_ms)));
    row.appendChild(el("td", { class: "num" }, fmtDuration(st.newest_checkpoint_age_ms)));
    row.appendChild(el("td", { class: "num" }, fmtBytes(st.checkpoint_bytes)));
    row.appendChild(el("td", {}, n.watermark === null ? "–" : fmtTime(n.watermark)));
    state.appendChild(row);
  }
  if (!state.rows.length) {
    const row = el("tr");
    row.appendChild(el("td", { colspan: "8", class: "hint" }, "no stateful stream"));
    state.appendChild(row);
  }

  const timed = $("event-time").tBodies[0];
  timed.textContent = "";
  const newest = s.app.last_completed_batch_ms;
  for (const n of s.streams.nodes) {
    if (n.late_records_total === undefined) continue;
    const row = el("tr", { "data-stream": n.key });
    row.appendChild(el("td", {}, n.name));
    row.appendChild(el("td", {}, n.watermark === null ? "none yet" : fmtTime(n.watermark)));
    row.appendChild(el("td", { class: "num" },
      n.watermark === null || newest === null ? "–" : fmtDuration(newest - n.watermark)));
    row.appendChild(el("td", { class: "num" }, fmtInt(n.late_records_total)));
    timed.appendChild(row);
  }
  if (!timed.rows.length) {
    const row = el("tr");
    row.appendChild(el("td", { colspan: "4", class: "hint" }, "no event-time stream"));
    timed.appendChild(row);
  }

  const errors = $("errors");
  errors.textContent = "";
  if (!s.errors.length) errors.appendChild(el("li", { class: "none" }, "none"));
  for (const e of s.errors) {
    const li = el("li");
    const where = e.batch_time_ms === null ? e.where : `${e.where}, batch ${fmtTime(e.batch_time_ms)}`;
    li.appendChild(el("strong", {}, `${fmtTime(e.time_ms)} · ${where}`));
    const lines = e.message.split("\n").filter((line) => line.trim());
    li.appendChild(el("div", { class: "error-line" }, lines.length ? lines[lines.length - 1] : ""));
    if (lines.length > 1) {  // a traceback: its last line above, the whole of it on request
      const details = el("details");
      details.appendChild(el("summary", {}, "traceback"));
      details.appendChild(el("pre", {}, e.message));
      li.appendChild(details);
    }
    errors.appendChild(li);
  }
  renderGraph(s.streams);
}

// ------------------------------------------------------------------ the stream graph
function renderGraph(streams) {
  const svg = $("graph");
  const byKey = new Map(streams.nodes.map((n) => [n.key, n]));
  const depth = new Map();
  for (const n of streams.nodes) {  // registration order is topological
    const parents = n.depends_on.filter((k) => byKey.has(k));
    depth.set(n.key, parents.length ? Math.max(...parents.map((k) => depth.get(k) ?? 0)) + 1 : 0);
  }
  const columns = [];
  for (const n of streams.nodes) {
    const d = depth.get(n.key);
    (columns[d] = columns[d] || []).push(n);
  }
  const W = 140, H = 44, GX = 36, GY = 14;
  const pos = new Map();
  columns.forEach((col, c) => col.forEach((n, r) => pos.set(n.key, { x: 8 + c * (W + GX), y: 8 + r * (H + GY) })));
  const width = 16 + columns.length * (W + GX) - GX;
  const height = 16 + Math.max(1, ...columns.map((c) => c.length)) * (H + GY) - GY;
  svg.textContent = "";
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const defs = svgEl("defs");
  const marker = svgEl("marker", { id: "arrow", viewBox: "0 0 10 10", refX: "10", refY: "5", markerWidth: "7",
    markerHeight: "7", orient: "auto-start-reverse" });
  marker.appendChild(svgEl("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#aab2bf" }));
  defs.appendChild(marker);
  svg.appendChild(defs);
  for (const [from, to] of streams.edges) {
    const a = pos.get(from), b = pos.get(to);
    if (!a || !b) continue;
    const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2, mx = (x1 + x2) / 2;
    svg.appendChild(svgEl("path", { class: "edge", d: `M ${x1} ${y1} C ${mx} ${y1}, ${mx} ${y2}, ${x2} ${y2}`,
      "data-from": from, "data-to": to }));
  }
  for (const n of streams.nodes) {
    const p = pos.get(n.key);
    const g = svgEl("g", { class: `node ${n.kind}`, transform: `translate(${p.x},${p.y})`, "data-key": n.key,
      "data-kind": n.kind });
    const details = [`${n.type} (${n.key})`, `slide ${fmtDuration(n.slide_ms)}`];
    if (n.window_ms !== null) details.push(`window ${fmtDuration(n.window_ms)}`);
    if (n.state && n.state.keys !== null) details.push(`${fmtInt(n.state.keys)} keys, ${fmtBytes(n.state.bytes)}`);
    if (n.input) details.push(`${fmtInt(n.input.records_total)} records`);
    g.appendChild(svgEl("title", {}, details.join("\n")));
    g.appendChild(svgEl("rect", { width: W, height: H }));
    const name = n.name.length > 20 ? `${n.name.slice(0, 19)}…` : n.name;
    g.appendChild(svgEl("text", { x: 8, y: 18 }, name));
    let sub = n.kind;
    if (n.window_ms !== null) sub += ` · ${fmtDuration(n.window_ms)}`;
    if (n.state && n.state.keys !== null) sub += ` · ${fmtInt(n.state.keys)} keys`;
    g.appendChild(svgEl("text", { x: 8, y: 34, class: "kind" }, sub));
    svg.appendChild(g);
  }
}

// ------------------------------------------------------------------ the timeline charts
function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}
function chart(id, field, opts = {}) {
  const svg = $(id);
  const W = svg.clientWidth || 480, H = svg.clientHeight || 150;
  const L = 52, R = 8, T = 8, B = 20;
  svg.textContent = "";
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const points = batches.filter((b) => b[field] !== null && b[field] !== undefined);
  // The last 10 minutes, or since the oldest batch when the run is younger (the whole width in use).
  const newest = batches.length ? batches[batches.length - 1].batch_time_ms : 0;
  const oldest = batches.length ? batches[0].batch_time_ms : 0;
  const step = batchIntervalMs || 1000;
  const x0 = Math.max(newest - timelineMs, oldest - step), span = Math.max(newest - x0, step);
  let top = Math.max(0, ...points.map((b) => b[field]));
  if (opts.limit) top = Math.max(top, opts.limit);
  top = niceMax(top);
  const x = (t) => L + ((t - x0) / span) * (W - L - R);
  const y = (v) => T + (1 - v / top) * (H - T - B);
  svg.appendChild(svgEl("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
  svg.appendChild(svgEl("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  for (const v of [0, top / 2, top]) {
    svg.appendChild(svgEl("text", { class: "tick", x: L - 4, y: y(v) + 3, "text-anchor": "end" }, fmtCompact(v)));
  }
  for (const frac of [0, 0.5, 1]) {
    const t = x0 + frac * span;
    const label = fmtTime(t).slice(11, 19);
    const anchor = frac === 0 ? "start" : frac === 1 ? "end" : "middle";
    svg.appendChild(svgEl("text", { class: "tick", x: x(t), y: H - 6, "text-anchor": anchor }, label));
  }
  if (opts.limit) {
    svg.appendChild(svgEl("line", { class: "limit", x1: L, x2: W - R, y1: y(opts.limit), y2: y(opts.limit) }));
  }
  if (opts.bars) {
    const bw = Math.max(1, Math.min(12, ((batchIntervalMs || 1000) / span) * (W - L - R) * 0.8));
    for (const b of points) {
      const h = Math.max(0, H - B - y(b[field]));
      svg.appendChild(svgEl("rect", { class: "bar", x: x(b.batch_time_ms) - bw / 2, y: H - B - h, width: bw, height: h }));
    }
  } else if (points.length) {
    const d = points.map((b, i) => `${i ? "L" : "M"} ${x(b.batch_time_ms).toFixed(1)} ${y(b[field]).toFixed(1)}`);
    svg.appendChild(svgEl("path", { class: "line", d: d.join(" ") }));
    for (const b of points.filter((p) => p.failed)) {
      svg.appendChild(svgEl("circle", { class: "dot failed", cx: x(b.batch_time_ms), cy: y(b[field]), r: 3 }));
    }
  }
}

// ------------------------------------------------------------------ the batches table
function jobsCell(td, batch) {
  const jobs = jobsByBatch.get(batch.batch_time_ms);
  td.textContent = "";
  if (!jobs) {
    td.textContent = "…";
    fetchJobs(batch.batch_time_ms);
    return;
  }
  if (!jobs.length) { td.textContent = "–"; return; }
  jobs.forEach((j, i) => {
    if (i) td.appendChild(document.createTextNode(" "));
    td.appendChild(j.url ? el("a", { href: j.url, title: batch.job_group }, `#${j.id}`)
      : el("span", { title: `${batch.job_group} (Spark UI disabled)` }, `#${j.id}`));
  });
}
async function fetchJobs(time) {
  if (jobsPending.has(time)) return;
  jobsPending.add(time);
  try {
    const detail = await getJSON(`api/batches/${time}`);
    jobsByBatch.set(time, detail.spark_jobs);
    const row = document.querySelector(`#batches tr[data-batch-time="${time}"]`);
    const batch = batches.find((b) => b.batch_time_ms === time);
    if (row && batch) jobsCell(row.querySelector('[data-field="spark_jobs"]'), batch);
  } catch (e) {
    // left as "…": tried again at the next refresh
  } finally {
    jobsPending.delete(time);
  }
}
function renderBatches() {
  const body = $("batches").tBodies[0];
  body.textContent = "";
  const shown = batches.slice(-TABLE_ROWS).reverse();
  for (const b of shown) {
    const row = el("tr", { "data-batch-time": String(b.batch_time_ms), class: b.failed ? "failed" : "" });
    row.appendChild(el("td", { "data-field": "batch_time", title: `${b.batch_time_ms} ms` }, fmtTime(b.batch_time_ms)));
    for (const f of ["num_records", "scheduling_delay_ms", "processing_delay_ms", "total_delay_ms"]) {
      row.appendChild(el("td", { class: "num", "data-field": f }, fmtMs(b[f])));
    }
    const status = b.dropped ? "dropped" : b.failed ? "failed" : b.attempts > 1 ? `ok (try ${b.attempts})` : "ok";
    row.appendChild(el("td", { "data-field": "status", class: b.failed || b.dropped ? "status-failed" : "status-ok",
      title: b.failure || "" }, status));
    const jobs = el("td", { "data-field": "spark_jobs" });
    jobsCell(jobs, b);
    row.appendChild(jobs);
    body.appendChild(row);
  }
  if (!shown.length) {
    const row = el("tr");
    row.appendChild(el("td", { colspan: "7", class: "hint" }, "no batch completed yet"));
    body.appendChild(row);
  }
  const last = batches[batches.length - 1];
  $("last-delay").textContent = last ? fmtDuration(last.total_delay_ms) : "–";
}

function renderTimeline() {
  chart("chart-records", "num_records", { bars: true });
  chart("chart-processing", "processing_delay_ms", { limit: batchIntervalMs });
  chart("chart-scheduling", "scheduling_delay_ms");
  chart("chart-total", "total_delay_ms");
}

// ------------------------------------------------------------------ polling
async function refresh() {
  try {
    const newest = batches.length ? batches[batches.length - 1].batch_time_ms : null;
    const [status, fresh] = await Promise.all([
      getJSON("api/status"),
      getJSON(newest === null ? "api/batches" : `api/batches?after=${newest}`),
    ]);
    renderStatus(status);
    batches = batches.concat(fresh);
    if (batches.length) {
      const horizon = batches[batches.length - 1].batch_time_ms - timelineMs;
      batches = batches.filter((b) => b.batch_time_ms > horizon);
    }
    for (const t of jobsByBatch.keys()) if (!batches.some((b) => b.batch_time_ms === t)) jobsByBatch.delete(t);
    renderBatches();
    renderTimeline();
    const conn = $("connection");
    conn.textContent = `updated ${new Date().toLocaleTimeString()}`;
    conn.className = "connection";
  } catch (e) {
    const conn = $("connection");
    conn.textContent = `not reachable (${e.message}); retrying`;
    conn.className = "connection down";
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}
refresh();
