// orderlymq console: polls /api/state and renders tables and two SVG line charts.
// Data is written with textContent only (names come from users), never as HTML.
"use strict";

const PALETTE = ["#2f6fde", "#e8710a", "#1a7f37", "#c62828", "#8e44ad", "#00838f", "#9a6700", "#5d4037"];
const SVG_NS = "http://www.w3.org/2000/svg";
let refreshMs = 1000;

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child));
  return node;
}

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function fmt(n) { return Number(n).toLocaleString("en-US", { maximumFractionDigits: 1 }); }
function secs(s) { return s === null || s === undefined ? "—" : `${s.toFixed(1)} s`; }
function bytes(n) { return n < 1024 ? `${n} B` : n < 1048576 ? `${(n / 1024).toFixed(1)} KiB` : `${(n / 1048576).toFixed(1)} MiB`; }
function clock(ms) { return new Date(ms).toLocaleTimeString(); }

function fillTable(id, rows, emptyText, columns) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren();
  if (!rows.length) {
    body.append(el("tr", { class: "empty-row" }, el("td", { colspan: columns }, emptyText)));
    return;
  }
  for (const row of rows) body.append(row);
}

function cell(value, cls = "") { return el("td", cls ? { class: cls } : {}, value); }

function renderHealth(state) {
  const status = document.getElementById("status");
  const snap = state.snapshot;
  const down = state.error !== null;
  status.textContent = down ? "UNREACHABLE" : snap.broker.status;
  status.className = "pill " + (down ? "bad" : snap.broker.status === "SERVING" ? "ok" : "bad");
  document.getElementById("broker-line").textContent = snap
    ? `${snap.broker.broker_name} ${snap.broker.version} at ${state.brokers} · health ${fmt(snap.broker.rtt_ms)} ms`
    : state.brokers;
  const problem = document.getElementById("problem");
  problem.hidden = !down;
  if (down) {
    const seen = snap ? ` Showing what was seen at ${clock(snap.time_ms)}.` : "";
    problem.textContent = `Cannot read the broker at ${state.brokers}: ${state.error}.${seen}`;
  }
}

function renderTopics(snap, rates) {
  const rows = [];
  for (const topic of snap.topics) {
    topic.queues.forEach((q, i) => {
      rows.push(el("tr", { "data-topic": topic.name, "data-queue": q.queue_id },
        cell(i === 0 ? topic.name : ""), cell(q.queue_id), cell(fmt(q.min_offset), "num"),
        cell(fmt(q.max_offset), "num"), cell(fmt(q.max_offset - q.min_offset), "num"),
        cell(i === 0 && topic.name in rates ? fmt(rates[topic.name]) : "", "num")));
    });
  }
  fillTable("topics", rows, "no topics", 6);
}

function renderGroups(snap) {
  const box = document.getElementById("groups");
  box.replaceChildren();
  if (!snap.groups.length) box.append(el("p", { class: "muted" }, "no consumer group has committed, locked or joined yet"));
  for (const group of snap.groups) {
    const total = el("span", { "data-role": "group-lag", class: group.lag ? "lagging" : "" }, fmt(group.lag));
    const members = group.consumers.length ? group.consumers.join(", ") : "none live";
    const table = el("table", {}, el("thead", {}, el("tr", {},
      ...["topic", "queue", "max offset", "committed", "lag", "lock holder", "committed by"].map(
        (h, i) => el("th", i >= 2 && i <= 4 ? { class: "num" } : {}, h)))));
    const body = el("tbody");
    for (const q of group.queues) {
      body.append(el("tr", { "data-topic": q.topic, "data-queue": q.queue_id },
        cell(q.topic), cell(q.queue_id), cell(fmt(q.max_offset), "num"),
        cell(q.committed < 0 ? "—" : fmt(q.committed), "num"),
        el("td", { class: "num" + (q.lag ? " lagging" : ""), "data-role": "queue-lag" }, fmt(q.lag)),
        cell(q.holder || "—"), cell(q.committed_by || "—")));
    }
    table.append(body);
    box.append(el("div", { class: "group", "data-group": group.name },
      el("h3", {}, group.name, el("span", { class: "muted" }, " · lag "), total,
        el("span", { class: "muted" }, ` · consumers: ${members}`)), table));
  }
}

function renderLocks(snap) {
  const rows = [];
  for (const group of snap.groups) {
    for (const lock of group.locks) {
      rows.push(el("tr", {}, cell(group.name), cell(lock.topic), cell(lock.queue_id), cell(lock.client_id),
        cell(lock.epoch, "num"), cell(secs(lock.lease_left_s), "num")));
    }
  }
  fillTable("locks", rows, "no queue is locked", 6);
}

function renderTransactions(snap) {
  const rows = snap.transactions.map((t) => el("tr", {}, cell(t.txn_id), cell(t.state),
    cell(secs(t.idle_s), "num"), cell(secs(t.expires_in_s), "num"), cell(bytes(t.staged_bytes), "num")));
  fillTable("transactions", rows, "no open transaction", 5);
}

// A line chart of named series [{name, points: [[t, value], ...]}] over the timeline's time span.
function drawChart(id, series, t0, t1) {
  const chart = document.getElementById(id);
  const w = chart.clientWidth || 600, h = chart.clientHeight || 220;
  const pad = { l: 56, r: 12, t: 10, b: 22 };
  chart.setAttribute("viewBox", `0 0 ${w} ${h}`);
  chart.replaceChildren();
  const legend = chart.nextElementSibling && chart.nextElementSibling.classList.contains("legend")
    ? chart.nextElementSibling : chart.insertAdjacentElement("afterend", el("div", { class: "legend" }));
  legend.replaceChildren();
  if (!series.length || t1 <= t0) {
    chart.append(svg("text", { x: w / 2, y: h / 2, "text-anchor": "middle", class: "empty" }, "collecting data…"));
    return;
  }
  const top = niceMax(Math.max(1, ...series.flatMap((s) => s.points.map((p) => p[1]))));
  const x = (t) => pad.l + ((t - t0) / (t1 - t0)) * (w - pad.l - pad.r);
  const y = (v) => h - pad.b - (v / top) * (h - pad.t - pad.b);
  for (let i = 0; i <= 4; i++) {
    const v = (top * i) / 4;
    chart.append(svg("line", { x1: pad.l, x2: w - pad.r, y1: y(v), y2: y(v), class: "axis" }));
    chart.append(svg("text", { x: pad.l - 6, y: y(v) + 4, "text-anchor": "end" }, fmt(v)));
  }
  chart.append(svg("text", { x: pad.l, y: h - 4 }, clock(t0 * 1000)));
  chart.append(svg("text", { x: w - pad.r, y: h - 4, "text-anchor": "end" }, clock(t1 * 1000)));
  series.forEach((s, i) => {
    const color = PALETTE[i % PALETTE.length];
    const path = s.points.map((p, j) => `${j ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join("");
    chart.append(svg("path", { d: path, fill: "none", stroke: color, "stroke-width": 2, "data-series": s.name }));
    const last = s.points[s.points.length - 1];
    const swatch = el("i");
    swatch.style.background = color;  // through CSSOM: the page's policy forbids inline style attributes
    legend.append(el("span", { "data-series": s.name }, swatch, `${s.name} `, el("b", {}, fmt(last ? last[1] : 0))));
  });
}

function niceMax(v) {
  const step = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * step >= v) return m * step;
  return 10 * step;
}

function seriesOf(timeline, field) {
  const names = [...new Set(timeline.flatMap((p) => Object.keys(p[field])))].sort();
  return names.map((name) => ({
    name, points: timeline.filter((p) => name in p[field]).map((p) => [p.t, p[field][name]]),
  })).filter((s) => s.points.length);
}

function render(state) {
  refreshMs = state.refresh_ms;
  document.getElementById("refresh").textContent = `${refreshMs / 1000} s`;
  renderHealth(state);
  const snap = state.snapshot;
  if (!snap) return;
  const timeline = state.timeline;
  const latest = timeline.length ? timeline[timeline.length - 1] : { rates: {} };
  const t0 = timeline.length ? timeline[0].t : 0, t1 = timeline.length ? timeline[timeline.length - 1].t : 0;
  renderTopics(snap, latest.rates);
  renderGroups(snap);
  renderLocks(snap);
  renderTransactions(snap);
  drawChart("lag-chart", seriesOf(timeline, "lags"), t0, t1);
  drawChart("rate-chart", seriesOf(timeline, "rates"), t0, t1);
  document.getElementById("updated").textContent = clock(snap.time_ms);
}

async function refresh() {
  try {
    const answer = await fetch("/api/state", { cache: "no-store" });
    if (!answer.ok) throw new Error(`the console answered ${answer.status}`);
    render(await answer.json());
  } catch (err) {
    const problem = document.getElementById("problem");
    problem.hidden = false;
    problem.textContent = `Cannot reach the console itself (${err.message}); is orderlymq console still running?`;
    document.getElementById("status").className = "pill bad";
  } finally {
    setTimeout(refresh, refreshMs);
  }
}

refresh();
