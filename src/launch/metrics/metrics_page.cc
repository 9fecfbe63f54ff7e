#include "launch/metrics/metrics_page.h"

namespace dtrain::launch {

std::string_view metrics_page() {
  // The slowest rank and a stuck job are judged as `dtrain top` judges them: compute per step
  // against the median; no rank's call count growing while some rank is in a call.
  static constexpr std::string_view kPage = R"html(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>dtrain run</title>
<style>
  body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
  h1 { font-size: 1.3em; margin: 0 0 .3em; }
  h2 { font-size: 1.05em; margin: 1.4em 0 .4em; }
  table { border-collapse: collapse; }
  th, td { padding: .2em .7em; text-align: right; border-bottom: 1px solid #ddd; }
  th { background: #f3f3f3; }
  #stuck { color: #b00; font-weight: bold; }
  .note { color: #666; }
  svg { border: 1px solid #ddd; background: #fff; }
  .legend span { display: inline-block; margin-right: 1.2em; }
  .swatch { display: inline-block; width: .9em; height: .9em; vertical-align: middle;
            margin-right: .3em; }
</style>
</head>
<body>
<h1>dtrain run <span id="where" class="note"></span></h1>
<div id="summary" class="note">waiting for the first sample...</div>
<div id="slowest"></div>
<div id="stuck"></div>
<h2>Ranks</h2>
<table id="ranks">
  <thead><tr><th>rank</th><th>step</th><th>samples/s</th><th>step ms</th><th>compute ms</th>
  <th>comm ms</th><th>calls</th><th>in call</th><th>report age</th></tr></thead>
  <tbody></tbody>
</table>
<h2>Step time over the run (ms)</h2>
<svg id="steptime" width="900" height="260"></svg>
<div id="steptime-legend" class="legend"></div>
<h2>The last steps of each rank</h2>
<div class="legend"><span><i class="swatch" style="background:#4a7fc1"></i>compute</span>
<span><i class="swatch" style="background:#e8912d"></i>communication and waiting for the
others</span></div>
<svg id="timeline" width="900" height="40"></svg>
<p class="note">Figures from each rank's ProgressReporter (steps) and flight recorder (calls),
sampled once a second by <code>dtrain run</code>; the same as <a href="/metrics">/metrics</a>
and <code>dtrain top</code>.</p>
<script>
"use strict";
const colors = ["#4a7fc1", "#e8912d", "#3a9d5d", "#c94f4f", "#8a63b8", "#7a7a7a", "#c2a23a",
                "#2aa1a8"];
const svgNs = "http://www.w3.org/2000/svg";
function el(name, attrs, parent) {
  const e = document.createElementNS(svgNs, name);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  parent.appendChild(e);
  return e;
}
function fmt(v, digits, scale) {
  return v === undefined || v === null ? "-" : (v * (scale || 1)).toFixed(digits);
}
function median(xs) {
  const s = xs.slice().sort((a, b) => a - b);
  return s[Math.floor((s.length - 1) / 2)];
}
function drawTable(last) {
  const body = document.querySelector("#ranks tbody");
  body.innerHTML = "";
  for (const r of last.ranks) {
    const tr = document.createElement("tr");
    tr.id = "rank-" + r.rank;
    const cells = [r.rank, fmt(r.step, 0), fmt(r.samples_per_second, 1),
                   fmt(r.step_seconds, 1, 1e3), fmt(r.compute_seconds, 1, 1e3),
                   fmt(r.communication_seconds, 1, 1e3), fmt(r.calls, 0),
                   r.in_calls === undefined ? "-" : (r.in_calls > 0 ? "yes" : "no"),
                   r.report_age_seconds === undefined ? "-" : fmt(r.report_age_seconds, 1) + " s"];
    for (const c of cells) {
      const td = document.createElement("td");
      td.textContent = c;
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
}
function drawSlowestAndStuck(h) {
  const last = h.samples[h.samples.length - 1];
  const compute = last.ranks.filter(r => r.compute_seconds !== undefined);
  let text = "";
  if (compute.length >= 2) {
    const m = median(compute.map(r => r.compute_seconds));
    const slow = compute.reduce((a, b) => b.compute_seconds > a.compute_seconds ? b : a);
    if (m > 0 && slow.compute_seconds >= 1.2 * m)
      text = "slowest: rank " + slow.rank + " computes " + fmt(slow.compute_seconds, 1, 1e3) +
             " ms a step, " + (slow.compute_seconds / m).toFixed(1) + "x the median " +
             fmt(m, 1, 1e3) + " ms";
  }
  document.getElementById("slowest").textContent = text;
  // Stuck: the calls of every rank unchanged for 10 s while some rank is in one.
  let stuck = "";
  const calls = s => s.ranks.map(r => r.calls === undefined ? -1 : r.calls).join(",");
  let i = h.samples.length - 1;
  while (i > 0 && calls(h.samples[i - 1]) === calls(last)) i--;
  const quiet = last.time - h.samples[i].time;
  const waiting = last.ranks.filter(r => r.in_calls > 0).map(r => r.rank);
  const idle = last.ranks.filter(r => r.in_calls === 0).map(r => r.rank);
  if (waiting.length > 0 && quiet >= 10)
    stuck = "STUCK: no rank has completed a call for " + quiet.toFixed(0) + " s; in a call: " +
            waiting.join(", ") + "; not in one: " + (idle.length ? idle.join(", ") : "none");
  document.getElementById("stuck").textContent = stuck;
}
function drawStepTime(h) {
  const svg = document.getElementById("steptime");
  svg.innerHTML = "";
  const W = +svg.getAttribute("width"), H = +svg.getAttribute("height"), pad = 40;
  const t0 = h.samples[0].time, t1 = Math.max(h.samples[h.samples.length - 1].time, t0 + 1);
  let ymax = 0;
  for (const s of h.samples) for (const r of s.ranks)
    if (r.step_seconds !== undefined) ymax = Math.max(ymax, r.step_seconds * 1e3);
  ymax = ymax > 0 ? ymax * 1.1 : 1;
  const x = t => pad + (t - t0) / (t1 - t0) * (W - 2 * pad);
  const y = v => H - pad + 10 - v / ymax * (H - 2 * pad);
  el("line", {x1: pad, y1: y(0), x2: W - pad, y2: y(0), stroke: "#999"}, svg);
  el("line", {x1: pad, y1: y(0), x2: pad, y2: y(ymax), stroke: "#999"}, svg);
  el("text", {x: 4, y: y(ymax) + 4, "font-size": 11}, svg).textContent = ymax.toFixed(0);
  el("text", {x: 4, y: y(0), "font-size": 11}, svg).textContent = "0";
  el("text", {x: W - pad - 40, y: H - 4, "font-size": 11}, svg).textContent =
      ((t1 - t0)).toFixed(0) + " s";
  const legend = document.getElementById("steptime-legend");
  legend.innerHTML = "";
  h.ranks.forEach((rank, i) => {
    const pts = [];
    for (const s of h.samples) {
      const r = s.ranks.find(q => q.rank === rank);
      if (r && r.step_seconds !== undefined)
        pts.push(x(s.time).toFixed(1) + "," + y(r.step_seconds * 1e3).toFixed(1));
    }
    if (pts.length)
      el("polyline", {points: pts.join(" "), fill: "none", stroke: colors[i % colors.length],
                      "stroke-width": 2, "data-rank": rank}, svg);
    const span = document.createElement("span");
    span.innerHTML = '<i class="swatch" style="background:' + colors[i % colors.length] +
                     '"></i>rank ' + rank;
    legend.appendChild(span);
  });
}
function drawTimeline(h) {
  const svg = document.getElementById("timeline");
  svg.innerHTML = "";
  const last = h.samples.slice(-20);
  const rows = h.ranks.length, rowH = 24, W = +svg.getAttribute("width"), left = 60;
  svg.setAttribute("height", rows * rowH + 10);
  // Each sample is one step of that moment, drawn to scale: the longest step fills a slot.
  let longest = 0;
  for (const s of last) for (const r of s.ranks)
    if (r.step_seconds !== undefined) longest = Math.max(longest, r.step_seconds);
  const slot = (W - left) / Math.max(last.length, 1);
  h.ranks.forEach((rank, row) => {
    el("text", {x: 4, y: row * rowH + 17, "font-size": 12}, svg).textContent = "rank " + rank;
    last.forEach((s, k) => {
      const r = s.ranks.find(q => q.rank === rank);
      if (!r || r.step_seconds === undefined || longest <= 0) return;
      const x0 = left + k * slot, scale = (slot - 3) / longest;
      el("rect", {x: x0, y: row * rowH + 4, width: r.compute_seconds * scale, height: rowH - 8,
                  fill: "#4a7fc1", class: "compute", "data-rank": rank}, svg);
      el("rect", {x: x0 + r.compute_seconds * scale, y: row * rowH + 4,
                  width: r.communication_seconds * scale, height: rowH - 8, fill: "#e8912d",
                  class: "communication", "data-rank": rank}, svg);
    });
  });
}
async function refresh() {
  try {
    const h = await (await fetch("/history.json", {cache: "no-store"})).json();
    document.getElementById("where").textContent = location.host;
    if (!h.samples.length) return;
    const last = h.samples[h.samples.length - 1];
    document.getElementById("summary").textContent =
        h.ranks.length + " ranks, restarts " + h.restarts + ", " + h.samples.length +
        " samples, last at " + new Date(last.time * 1000).toLocaleTimeString();
    drawTable(last);
    drawSlowestAndStuck(h);
    drawStepTime(h);
    drawTimeline(h);
  } catch (e) {
    document.getElementById("summary").textContent = "the launcher does not answer (" + e + ")";
  }
}
refresh();
setInterval(refresh, 1000);
</script>
</body>
</html>
)html";
  return kPage;
}

}  // namespace dtrain::launch
