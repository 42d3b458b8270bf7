// rl-swarm observer page: polls /api/state and draws tables and inline SVG charts.
// Peer-supplied text (model ids, family names, completions, refusal reasons) is only ever inserted with
// textContent or as SVG text nodes, never as markup, so a completion containing <script> shows as text.
"use strict";

const POLL_MS = 2000;
const SVG_NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
  "#7f7f7f", "#bcbd22"];
const colorOf = new Map();

function peerColor(id) {
  if (!colorOf.has(id)) colorOf.set(id, PALETTE[colorOf.size % PALETTE.length]);
  return colorOf.get(id);
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function svgEl(tag, attrs) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  return e;
}

function fmt(x, digits = 3) {
  return x === null || x === undefined ? "–" : Number(x).toFixed(digits);
}

function short(id) {
  return String(id).slice(0, 10);
}

function ago(now, t) {
  const s = Math.max(0, now - t);
  return s < 90 ? `${s.toFixed(0)} s ago` : `${(s / 60).toFixed(1)} min ago`;
}

function fillRows(tbody, rows) {
  tbody.replaceChildren(...rows);
}

// A line chart: series = [{label, color, dashed, points: [[x, y], ...], attrs}], x in unix seconds.
function lineChart(svg, series, opts = {}) {
  const W = 640, H = 240, L = 44, R = 120, T = 10, B = 26;
  const all = series.flatMap((s) => s.points);
  const kids = [];
  if (all.length === 0) {
    kids.push(Object.assign(svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }), { textContent: "no data yet" }));
    svg.replaceChildren(...kids);
    return;
  }
  let x0 = Math.min(...all.map((p) => p[0])), x1 = Math.max(...all.map((p) => p[0]));
  if (x1 - x0 < 1) x1 = x0 + 1;
  let y0 = opts.ymin !== undefined ? opts.ymin : Math.min(0, ...all.map((p) => p[1]));
  let y1 = opts.ymax !== undefined ? opts.ymax : Math.max(...all.map((p) => p[1]));
  if (y1 - y0 < 1e-9) y1 = y0 + 1;
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
  for (let i = 0; i <= 4; i++) {
    const y = y0 + ((y1 - y0) * i) / 4;
    kids.push(svgEl("line", { x1: L, x2: W - R, y1: sy(y), y2: sy(y), stroke: "#e5e7eb" }));
    const label = svgEl("text", { x: L - 4, y: sy(y) + 4, "text-anchor": "end" });
    label.textContent = y1 - y0 >= 40 ? y.toFixed(0) : y1 - y0 >= 4 ? y.toFixed(1) : y.toFixed(2);
    kids.push(label);
  }
  const xl = svgEl("text", { x: L, y: H - 6 });
  xl.textContent = new Date(x0 * 1000).toLocaleTimeString();
  const xr = svgEl("text", { x: W - R, y: H - 6, "text-anchor": "end" });
  xr.textContent = new Date(x1 * 1000).toLocaleTimeString();
  kids.push(xl, xr);
  let legendY = T + 10;
  for (const s of series) {
    if (s.points.length === 0) continue;
    const pts = s.points.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ");
    const line = svgEl("polyline", {
      points: pts, fill: "none", stroke: s.color, "stroke-width": s.dashed ? 1.5 : 2,
      "stroke-dasharray": s.dashed ? "5 4" : "none", "data-n": s.points.length, ...(s.attrs || {}),
    });
    kids.push(line);
    if (s.points.length === 1) {
      const p = s.points[0];
      kids.push(svgEl("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 3, fill: s.color }));
    }
    if (!s.dashed) {
      const t = svgEl("text", { x: W - R + 8, y: legendY });
      t.style.fill = s.color; // CSSOM, not a style attribute: the page's CSP forbids inline styles
      t.textContent = s.label;
      kids.push(t);
      legendY += 14;
    }
  }
  svg.replaceChildren(...kids);
}

// Moving mean over the last k records, weighted by completions; key is "verified" or "hint".
function movingMean(series, key, k = 10) {
  const out = [];
  for (let i = 0; i < series.length; i++) {
    let s = 0, n = 0;
    for (let j = Math.max(0, i - k + 1); j <= i; j++) {
      const v = series[j][key];
      if (v === null || v === undefined) continue;
      s += v * series[j].n;
      n += series[j].n;
    }
    if (n > 0) out.push([series[i].t, s / n]);
  }
  return out;
}

function card(k, v) {
  const c = el("div", null, "card");
  c.append(el("div", v, "v"), el("div", k, "k"));
  return c;
}

function render(st) {
  document.getElementById("swarm").textContent = st.swarm;
  const now = st.now;
  const active = st.peers.filter((p) => p.active).length;
  const traffic = st.traffic;
  const recentTraffic = traffic.slice(-12);
  const span = recentTraffic.length * st.bucket_s || 1;
  const recs = recentTraffic.reduce((a, p) => a + p.records, 0) / span;
  const kbs = recentTraffic.reduce((a, p) => a + p.bytes, 0) / span / 1000;
  const refusals = Object.values(st.refusals.validator).reduce((a, b) => a + b, 0) +
    Object.values(st.refusals.tasks).reduce((a, b) => a + b, 0) +
    Object.values(st.refusals.transport).reduce((a, b) => a + b, 0);
  document.getElementById("summary").replaceChildren(
    card("peers active / seen", `${active} / ${st.peers.length}`),
    card("DHT peers", st.transport.dht_peers ?? "–"),
    card("records accepted", st.records_accepted),
    card("records/s (last min)", recs.toFixed(2)),
    card("kB/s (last min)", kbs.toFixed(1)),
    card("kB received", (st.bytes_in / 1000).toFixed(0)),
    card("refused", refusals),
  );

  // Peers table.
  const rows = st.peers.map((p) => {
    const tr = el("tr");
    tr.dataset.peer = p.peer;
    const idCell = el("td", null, "mono");
    const sw = el("span", null, "swatch");
    sw.style.background = peerColor(p.peer);
    idCell.append(sw, el("span", short(p.peer)));
    idCell.title = p.peer;
    const gap = p.gap === null ? el("td", "–") : p.gap ? el("td", "GAP", "flag") : el("td", "ok", "ok");
    if (p.gap) gap.title = "self-reported reward differs from the verified one";
    const fams = Object.entries(p.families).map(([f, n]) => `${f} (${n})`).join(", ");
    const ev = p.eval ? fmt(p.eval.accuracy) : "–";
    const verified = el("td", fmt(p.verified), "num verified");
    verified.dataset.completions = p.completions;
    tr.append(idCell, el("td", p.model), el("td", fams), el("td", p.records, "num"), el("td", p.completions, "num"),
      el("td", fmt(p.solve_rate), "num exact"), verified, el("td", fmt(p.hint), "num hint"), gap, el("td", ev, "num"),
      el("td", ago(now, p.last_seen)));
    return tr;
  });
  fillRows(document.querySelector("#peers tbody"), rows);

  // Charts.
  const peerSeries = [];
  for (const p of st.peers) {
    const c = peerColor(p.peer);
    peerSeries.push({ label: short(p.peer), color: c, points: movingMean(p.series, "verified"),
      attrs: { "data-peer": p.peer, "data-kind": "verified" } });
    peerSeries.push({ label: short(p.peer), color: c, dashed: true, points: movingMean(p.series, "hint"),
      attrs: { "data-peer": p.peer, "data-kind": "hint" } });
  }
  lineChart(document.getElementById("chart-peers"), peerSeries, { ymin: 0, ymax: 1 });
  const famSeries = Object.entries(st.families).map(([name, f], i) => ({
    label: name, color: PALETTE[i % PALETTE.length], points: f.series.map((p) => [p.t, p.verified]),
    attrs: { "data-family": name },
  }));
  lineChart(document.getElementById("chart-families"), famSeries, { ymin: 0, ymax: 1 });
  lineChart(document.getElementById("chart-traffic"), [
    { label: "records/s", color: PALETTE[0], points: traffic.map((p) => [p.t, p.records / st.bucket_s]) },
    { label: "kB/s", color: PALETTE[4], points: traffic.map((p) => [p.t, p.bytes / st.bucket_s / 1000]) },
  ]);
  lineChart(document.getElementById("chart-peercount"), [
    { label: "active", color: PALETTE[2], points: st.peer_counts.map((p) => [p.t, p.active]) },
    { label: "seen", color: PALETTE[3], points: st.peer_counts.map((p) => [p.t, p.seen]) },
    { label: "DHT peers", color: PALETTE[8],
      points: st.peer_counts.filter((p) => p.dht !== null && p.dht !== undefined).map((p) => [p.t, p.dht]) },
  ], { ymin: 0 });

  // Refusals.
  const refRows = [];
  for (const [where, counts] of Object.entries(st.refusals)) {
    for (const [reason, n] of Object.entries(counts)) {
      const tr = el("tr");
      tr.append(el("td", where), el("td", reason, "mono"), el("td", n, "num"));
      refRows.push(tr);
    }
  }
  if (refRows.length === 0) {
    const tr = el("tr");
    const td = el("td", "none so far", "ok");
    td.colSpan = 3;
    tr.append(td);
    refRows.push(tr);
  }
  fillRows(document.querySelector("#refusals tbody"), refRows);

  fillRows(document.querySelector("#families tbody"), Object.entries(st.families).map(([name, f]) => {
    const tr = el("tr");
    tr.append(el("td", name), el("td", f.n, "num"), el("td", fmt(f.verified), "num"));
    return tr;
  }));

  const evals = st.peers.filter((p) => p.eval);
  document.getElementById("heldout-note").textContent = evals.length
    ? "from signed eval records (the node's own held-out measurement; not re-verified here)"
    : "no peer has published a held-out evaluation (eval record) yet";
  fillRows(document.querySelector("#heldout tbody"), evals.map((p) => {
    const tr = el("tr");
    tr.append(el("td", short(p.peer), "mono"), el("td", p.eval.step ?? "–", "num"), el("td", fmt(p.eval.accuracy), "num"),
      el("td", fmt(p.eval.greedy_accuracy), "num"));
    return tr;
  }));

  fillRows(document.getElementById("recent"), st.recent.map((r) => {
    const li = el("li");
    li.dataset.peer = r.peer;
    const head = el("div");
    head.append(el("span", short(r.peer), "mono"), el("span", ` · ${r.family} #${r.index} · verified ${fmt(r.verified, 2)}` +
      ` · self-reported ${fmt(r.hint, 2)}`));
    li.append(head, el("pre", r.text, "completion"));
    return li;
  }));
}

async function poll() {
  const status = document.getElementById("status");
  try {
    const resp = await fetch("/api/state", { cache: "no-store" });
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    const st = await resp.json();
    render(st);
    status.textContent = `updated ${new Date().toLocaleTimeString()}`;
    status.className = "status";
    document.body.dataset.updated = String(Date.now());
  } catch (e) {
    status.textContent = `observer unreachable (${e.message}); retrying`;
    status.className = "status bad";
  }
  setTimeout(poll, POLL_MS);
}

poll();
