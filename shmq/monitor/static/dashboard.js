// shmq dashboard: polls the broker's /api/v1/snapshot every second and draws it.
// Everything on this page comes from the broker itself (no network access needed); data is
// written with textContent only, never as HTML.
"use strict";

const POLL_MS = 1000;
const KEEP = 900;                       // points per chart: 15 minutes at one a second
const state = { points: [], charts: {}, open: new Set(), updates: 0, errors: 0, last: null };
window.shmqDashboard = state;           // for people poking at it (and the browser test)

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}
function row(cells) {
  const tr = document.createElement("tr");
  for (const c of cells) {
    if (c instanceof Node) { const td = el("td"); td.appendChild(c); tr.appendChild(td); }
    else if (Array.isArray(c)) tr.appendChild(el("td", c[0], c[1]));
    else tr.appendChild(el("td", c));
  }
  return tr;
}
const fmt = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });
function num(x) { return x === undefined || x === null ? "–" : fmt.format(x); }
function bytes(x) {
  if (x === undefined || x === null) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (x >= 1024 && i < units.length - 1) { x /= 1024; i++; }
  return fmt.format(x) + " " + units[i];
}
function duration(s) {
  if (s === undefined || s === null) return "–";
  s = Math.floor(s);
  const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600);
  const m = Math.floor(s % 3600 / 60), sec = s % 60;
  return (d ? d + "d " : "") + (d || h ? h + "h " : "") + (d || h || m ? m + "m " : "") + sec + "s";
}

// -- charts (uPlot) -------------------------------------------------------------------------
const SERIES = {
  messages: [["in", "messages_in", "#2563eb"], ["out", "messages_out", "#16a34a"]],
  bytes: [["in", "bytes_in", "#2563eb"], ["out", "bytes_out", "#16a34a"]],
  latency: [["produce p50", "produce_p50_ms", "#93c5fd"], ["produce p99", "produce_p99_ms", "#2563eb"],
            ["fetch p99 (incl. long poll)", "fetch_p99_ms", "#16a34a"]],
  lag: [["total lag", "lag", "#b45309"]],
};
function makeChart(name) {
  const host = document.getElementById("chart-" + name);
  const opts = {
    width: Math.max(300, host.clientWidth || 420), height: 200,
    scales: { x: { time: true } },
    series: [{}].concat(SERIES[name].map(([label, , color]) => (
      { label, stroke: color, width: 1.5, spanGaps: true }))),
    axes: [{}, { size: 80, values: (u, vals) => vals.map(v => name === "bytes" ? bytes(v) : num(v)) }],
    legend: { live: true },
  };
  return new uPlot(opts, chartData(name), host);
}
function chartData(name) {
  const pts = state.points;
  return [pts.map(p => p.t)].concat(SERIES[name].map(([, key]) => pts.map(p => p[key] ?? null)));
}
function drawCharts() {
  for (const name of Object.keys(SERIES)) {
    if (!state.charts[name]) state.charts[name] = makeChart(name);
    else state.charts[name].setData(chartData(name));
  }
}
window.addEventListener("resize", () => {
  for (const [name, c] of Object.entries(state.charts)) {
    const w = document.getElementById("chart-" + name).clientWidth;
    if (w) c.setSize({ width: w, height: 200 });
  }
});

// -- tables ---------------------------------------------------------------------------------
function fill(id, rows) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren(...rows);
}
function drawHealth(s) {
  const b = s.broker;
  const ok = b.workers_alive === b.workers;
  const st = document.getElementById("status");
  st.textContent = ok ? "up" : "degraded";
  st.className = "pill " + (ok ? "ok" : "bad");
  document.getElementById("bootstrap").textContent = b.bootstrap;
  document.getElementById("cluster").textContent = b.cluster_id;
  document.getElementById("workers").textContent = b.workers_alive + " / " + b.workers;
  document.getElementById("uptime").textContent = duration(b.uptime_s);
  document.getElementById("datadir").textContent = b.data_dir;
  // partitions whose last write failed (a full disk...): named with the reason until it clears
  const failing = s.storage_errors || [];
  const se = document.getElementById("storage");
  se.style.display = failing.length === 0 ? "none" : "";
  se.textContent = failing.length === 0 ? "" : "storage error: " + failing.slice(0, 4).map(
    e => e.topic + "-" + e.partition + " (" + e.error + ")").join(", ") +
    (failing.length > 4 ? " and " + (failing.length - 4) + " more" : "");
}
function drawProcesses(s) {
  fill("processes", s.processes.map(p => row([
    p.name, p.pid ?? "–", p.alive ? "running" : "down", [num(p.cpu_percent), "n"],
    [bytes(p.rss_bytes), "n"], [num(p.open_fds), "n"], [num(p.connections), "n"],
    [num(p.fsyncs), "n"], [num(p.restarts), "n"], [duration(p.uptime_s), "n"]])));
}
function drawTopics(s) {
  const rates = (s.rates && s.rates.topics) || {};
  const rows = [];
  for (const t of s.topics) {
    const r = rates[t.name] || {};
    const end = t.partition_list.reduce((a, p) => a + (p.high_watermark ?? 0) - (p.log_start ?? 0), 0);
    const tr = row([t.name, [t.partitions, "n"], [num(end), "n"], [num(r.messages_in), "n"],
                    [num(r.messages_out), "n"], [bytes(r.bytes_in), "n"], [bytes(t.size_bytes), "n"],
                    [num(t.segments), "n"]]);
    tr.className = "topic";
    tr.dataset.topic = t.name;
    tr.addEventListener("click", () => {
      if (state.open.has(t.name)) state.open.delete(t.name); else state.open.add(t.name);
      if (state.last) drawTopics(state.last);
    });
    rows.push(tr);
    if (state.open.has(t.name)) {
      for (const p of t.partition_list) {
        const d = row(["  partition " + p.partition + (p.storage_error ? " — " + p.storage_error : ""),
          ["leader " + p.leader + " epoch " + p.leader_epoch, "small"],
          [num(p.messages_in) + " in", "n"],
          ["start " + num(p.log_start), "n"], ["HW " + num(p.high_watermark), "n"],
          ["LSO " + num(p.last_stable) + " / LEO " + num(p.log_end), "n"],
          [bytes(p.size_bytes), "n"], [num(p.segments), "n"]]);
        d.className = "detail";
        d.dataset.topic = t.name;
        rows.push(d);
      }
    }
  }
  fill("topics", rows);
}
function drawGroups(s) {
  fill("groups", s.groups.map(g => {
    const parts = el("div");
    for (const o of g.offsets) {
      const line = el("div", o.topic + "-" + o.partition + ": " + num(o.committed) + " / " +
                      num(o.log_end) + " / ", "small");
      line.appendChild(el("span", num(o.lag), o.lag ? "lag-pos" : ""));
      parts.appendChild(line);
    }
    const members = el("div");
    for (const m of g.members) {
      const a = m.assignment.map(([t, ps]) => t + " [" + ps.join(",") + "]").join(" ");
      members.appendChild(el("div", m.client_id + " @ " + m.host + (a ? ": " + a : ""), "small"));
    }
    const tr = row([g.group, g.state, [g.members.length, "n"], [num(g.lag), g.lag ? "n lag-pos" : "n"],
                    parts, members]);
    tr.dataset.group = g.group;
    return tr;
  }));
}
function drawRequests(s) {
  const rates = (s.rates && s.rates.apis) || {};
  fill("requests", s.requests.map(r => {
    const errors = Object.values(r.errors).reduce((a, b) => a + b, 0);
    const t = r.times.total;
    const versions = Object.entries(r.versions).map(([v, n]) => "v" + v + ": " + num(n)).join(", ");
    return row([r.api, [num(r.count), "n"], [num(rates[r.api]), "n"], [num(errors), "n"],
                [t.count ? num(t.sum_s / t.count * 1000) : "–", "n"], [versions, "small"]]);
  }));
}

// -- polling --------------------------------------------------------------------------------
async function getJSON(path) {
  const r = await fetch(path, { cache: "no-store" });
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}
async function tick() {
  try {
    const s = await getJSON("/api/v1/snapshot");
    const r = s.rates || {};
    const lat = r.latency || {};
    if (r.messages_in !== undefined) {
      const t = s.time;
      const last = state.points[state.points.length - 1];
      if (!last || t - last.t >= 0.5) {
        state.points.push({ t, messages_in: r.messages_in, messages_out: r.messages_out,
          bytes_in: r.bytes_in, bytes_out: r.bytes_out,
          produce_p50_ms: lat.Produce ? lat.Produce.p50_ms : null,
          produce_p99_ms: lat.Produce ? lat.Produce.p99_ms : null,
          fetch_p99_ms: lat.Fetch ? lat.Fetch.p99_ms : null,
          lag: s.groups.reduce((a, g) => a + g.lag, 0) });
        if (state.points.length > KEEP) state.points.shift();
      }
    }
    state.last = s;
    drawHealth(s); drawProcesses(s); drawTopics(s); drawGroups(s); drawRequests(s); drawCharts();
    state.updates++;
    document.getElementById("updated").textContent =
      "Updated " + new Date(s.time * 1000).toLocaleTimeString() + ".";
  } catch (e) {
    state.errors++;
    const st = document.getElementById("status");
    st.textContent = "unreachable";
    st.className = "pill bad";
  }
  setTimeout(tick, POLL_MS);
}
async function start() {
  try {
    const h = await getJSON("/api/v1/history");
    state.points = h.points.slice(-KEEP);
  } catch (e) { state.errors++; }
  tick();
}
start();
