// Line charts drawn as SVG by the page itself (no library, nothing from the network), and
// what both training pages share: the UI's colour mode, the API calls, number formats.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
// Tableau 10: distinct in light and dark mode
const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
                 "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
const ACTIVE_STATES = new Set(["running", "deferred", "queued", "scheduled", "up_for_retry",
                               "up_for_reschedule", "restarting", null, undefined]);

// --- the UI's colour mode: the Airflow page around this frame, else the system's -------------
function followColourMode(onChange) {
  const root = document.documentElement;
  let parentRoot = null;
  try { parentRoot = window.parent !== window ? window.parent.document.documentElement : null; }
  catch (e) { parentRoot = null; }
  const dark = () => {
    if (parentRoot) {
      if (parentRoot.classList.contains("dark")) return true;
      if (parentRoot.classList.contains("light")) return false;
      const scheme = parentRoot.style.colorScheme;
      if (scheme) return scheme === "dark";
    }
    return window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches;
  };
  const apply = () => {
    const isDark = dark();
    if (root.classList.contains("dark") !== isDark) {
      root.classList.toggle("dark", isDark);
      if (onChange) onChange();
    }
  };
  apply();
  if (parentRoot && window.MutationObserver) {
    new MutationObserver(apply).observe(parentRoot, {attributes: true,
                                                     attributeFilter: ["class", "style"]});
  }
  if (window.matchMedia) {
    window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", apply);
  }
}

// --- the data endpoints (same origin: Airflow's session cookie goes with them) --------------
async function getJSON(path) {
  const response = await fetch(path, {credentials: "same-origin",
                                      headers: {Accept: "application/json"}});
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail || detail; } catch (e) { /* not JSON */ }
    if (typeof detail !== "string") detail = JSON.stringify(detail);
    const error = new Error(`${response.status}: ${detail}`);
    error.status = response.status;
    throw error;
  }
  return response.json();
}

// The Airflow UI's root (where /dags/... lives), from this page's own address under /ringflow.
function uiRoot() {
  const path = window.location.pathname;
  const at = path.lastIndexOf("/ringflow/");
  return window.location.origin + (at >= 0 ? path.slice(0, at) : "");
}

function taskTabUrl(dagId, runId, taskId, mapIndex) {
  const enc = encodeURIComponent;
  let path = `/dags/${enc(dagId)}/runs/${enc(runId)}/tasks/${enc(taskId)}`;
  if (mapIndex !== undefined && mapIndex !== null && mapIndex >= 0) path += `/mapped/${mapIndex}`;
  return `${uiRoot()}${path}/plugin/training`;
}

// Opens a page of the Airflow UI around this frame. The UI's frame sandbox has no
// allow-top-navigation, so the page is opened as the UI's own links do: a history entry and
// a popstate event its router follows (same origin: the frame may reach the UI's window).
function openInUi(url) {
  try {
    const ui = window.parent;
    if (ui && ui !== window) {
      const target = new URL(url, window.location.href);
      ui.history.pushState({}, "", target.pathname + target.search);
      ui.dispatchEvent(new ui.PopStateEvent("popstate", {state: {}}));
      return;
    }
  } catch (e) { /* not inside the UI: open it here */ }
  window.location.href = url;
}

// --- numbers -----------------------------------------------------------------------------------
function fmt(value, digits = 4) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  if (typeof value !== "number") return String(value);
  if (value !== 0 && (Math.abs(value) < 1e-3 || Math.abs(value) >= 1e6)) {
    return value.toExponential(2);
  }
  return Number(value.toPrecision(digits)).toLocaleString("en-US", {maximumFractionDigits: 6});
}

function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const s = Math.round(seconds);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
  return h ? `${h}:${String(m).padStart(2, "0")}:${String(r).padStart(2, "0")}`
           : `${m}:${String(r).padStart(2, "0")}`;
}

function el(tag, attrs = {}, text = null) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  if (text !== null) node.textContent = text;
  return node;
}

function svg(tag, attrs = {}, text = null) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  if (text !== null) node.textContent = text;
  return node;
}

// --- axes ---------------------------------------------------------------------------------------
function niceStep(span, count) {
  const raw = span / Math.max(count, 1);
  const power = Math.pow(10, Math.floor(Math.log10(raw)));
  const unit = raw / power;
  return (unit >= 5 ? 10 : unit >= 2 ? 5 : unit >= 1 ? 2 : 1) * power;
}

function linearTicks(lo, hi, count) {
  if (hi <= lo) { const pad = Math.abs(lo) * 0.05 || 1; lo -= pad; hi += pad; }
  const step = niceStep(hi - lo, count);
  const first = Math.floor(lo / step) * step, last = Math.ceil(hi / step) * step;
  const ticks = [];
  for (let t = first; t <= last + step / 2; t += step) ticks.push(Number(t.toPrecision(12)));
  return {lo: first, hi: last, ticks};
}

function logTicks(lo, hi) {
  const a = Math.floor(Math.log10(lo)), b = Math.ceil(Math.log10(hi));
  const ticks = [];
  const mantissas = b - a <= 2 ? [1, 2, 5] : [1];
  for (let e = a; e <= b; e++) {
    for (const m of mantissas) {
      const t = m * Math.pow(10, e);
      if (t >= Math.pow(10, a) && t <= Math.pow(10, b)) ticks.push(t);
    }
  }
  return {lo: Math.pow(10, a), hi: Math.pow(10, b), ticks};
}

// One notation for every tick of an axis: small or huge values all in exponent form.
function tickFormat(ticks) {
  const big = Math.max(...ticks.map(Math.abs));
  if (big !== 0 && (big < 0.01 || big >= 1e6)) {
    return t => (t === 0 ? "0" : t.toExponential(2));
  }
  return t => fmt(t, 3);
}

// --- the chart -----------------------------------------------------------------------------------
// spec: {title, xLabel, yLabel, logY, series: [{name, color, points: [[x, y]], join: [x, y]}],
//        markers: [{x, label}], readout: element}
function lineChart(container, spec) {
  container.replaceChildren();
  const W = 900, H = 320, M = {left: 72, right: 18, top: 28, bottom: 46};
  const series = spec.series.filter(s => s.points.length);
  const root = svg("svg", {viewBox: `0 0 ${W} ${H}`, role: "img",
                           "aria-label": spec.title || spec.yLabel});
  container.appendChild(root);
  if (spec.title) root.appendChild(svg("text", {x: M.left, y: 17, class: "title"}, spec.title));
  const all = series.flatMap(s => s.join ? [s.join, ...s.points] : s.points);
  if (!all.length) {
    root.appendChild(svg("text", {x: W / 2, y: H / 2, "text-anchor": "middle"},
                         spec.empty || "no progress logged yet"));
    return;
  }
  const logY = spec.logY && all.every(p => p[1] > 0);
  const xs = all.map(p => p[0]), ys = all.map(p => p[1]);
  const xAxis = linearTicks(Math.min(...xs), Math.max(...xs), 8);
  const yAxis = logY ? logTicks(Math.min(...ys), Math.max(...ys))
                     : linearTicks(Math.min(...ys), Math.max(...ys), 5);
  const px = x => M.left + (x - xAxis.lo) / (xAxis.hi - xAxis.lo || 1) * (W - M.left - M.right);
  const yv = y => logY ? Math.log10(y) : y;
  const py = y => H - M.bottom - (yv(y) - yv(yAxis.lo)) / (yv(yAxis.hi) - yv(yAxis.lo) || 1)
                                  * (H - M.top - M.bottom);
  const grid = svg("g", {class: "grid"});
  root.appendChild(grid);
  const yLabel = tickFormat(yAxis.ticks);
  for (const t of yAxis.ticks) {
    grid.appendChild(svg("line", {x1: M.left, x2: W - M.right, y1: py(t), y2: py(t)}));
    root.appendChild(svg("text", {x: M.left - 6, y: py(t) + 4, "text-anchor": "end"}, yLabel(t)));
  }
  for (const t of xAxis.ticks) {
    grid.appendChild(svg("line", {x1: px(t), x2: px(t), y1: M.top, y2: H - M.bottom}));
    root.appendChild(svg("text", {x: px(t), y: H - M.bottom + 16, "text-anchor": "middle"},
                         fmt(t, 6)));
  }
  root.appendChild(svg("line", {class: "axis-line", x1: M.left, x2: W - M.right,
                                y1: H - M.bottom, y2: H - M.bottom}));
  root.appendChild(svg("line", {class: "axis-line", x1: M.left, x2: M.left, y1: M.top,
                                y2: H - M.bottom}));
  root.appendChild(svg("text", {x: (M.left + W - M.right) / 2, y: H - 8,
                                "text-anchor": "middle"}, spec.xLabel));
  root.appendChild(svg("text", {x: 14, y: (M.top + H - M.bottom) / 2, "text-anchor": "middle",
                                transform: `rotate(-90 14 ${(M.top + H - M.bottom) / 2})`},
                       spec.yLabel + (logY ? " (log scale)" : "")));
  for (const marker of spec.markers || []) {
    const g = svg("g", {class: "resume"});
    g.appendChild(svg("line", {x1: px(marker.x), x2: px(marker.x), y1: M.top,
                               y2: H - M.bottom}));
    g.appendChild(svg("text", {x: px(marker.x) + 4, y: M.top + 12}, marker.label));
    root.appendChild(g);
  }
  for (const s of series) {
    if (s.join) {
      const [a, b] = [s.join, s.points[0]];
      root.appendChild(svg("path", {class: "join", stroke: s.color,
                                    d: `M${px(a[0])},${py(a[1])}L${px(b[0])},${py(b[1])}`}));
    }
    const d = s.points.map((p, i) => `${i ? "L" : "M"}${px(p[0]).toFixed(1)},`
                                     + `${py(p[1]).toFixed(1)}`).join("");
    const path = svg("path", {class: "series", stroke: s.color, d,
                              "data-series": s.name, "data-points": s.points.length});
    path.appendChild(svg("title", {}, s.name));
    root.appendChild(path);
    if (s.points.length === 1) {
      root.appendChild(svg("circle", {cx: px(s.points[0][0]), cy: py(s.points[0][1]), r: 3,
                                      fill: s.color}));
    }
  }
  if (spec.readout) hover(root, spec, series, px, py, W, H, M, xAxis);
}

// A vertical rule under the pointer and each series' value at the nearest logged step.
function hover(root, spec, series, px, py, W, H, M, xAxis) {
  const rule = svg("g", {class: "hover", visibility: "hidden"});
  rule.appendChild(svg("line", {y1: M.top, y2: H - M.bottom}));
  root.appendChild(rule);
  root.addEventListener("mousemove", event => {
    const box = root.getBoundingClientRect();
    const x = (event.clientX - box.left) / box.width * W;
    if (x < M.left || x > W - M.right) return;
    const step = xAxis.lo + (x - M.left) / (W - M.left - M.right) * (xAxis.hi - xAxis.lo);
    const parts = [];
    for (const s of series) {
      let best = s.points[0];
      for (const p of s.points) if (Math.abs(p[0] - step) < Math.abs(best[0] - step)) best = p;
      parts.push(`${s.name}: step ${best[0]} ${spec.yLabel} ${fmt(best[1])}`);
    }
    rule.firstChild.setAttribute("x1", x);
    rule.firstChild.setAttribute("x2", x);
    rule.setAttribute("visibility", "visible");
    spec.readout.textContent = parts.join("  ·  ");
  });
  root.addEventListener("mouseleave", () => {
    rule.setAttribute("visibility", "hidden");
    spec.readout.textContent = "";
  });
}

function legend(container, series) {
  container.replaceChildren();
  for (const s of series) {
    const item = el("span");
    const swatch = el("span", {class: "swatch"});
    swatch.style.background = s.color;
    item.append(swatch, s.name);
    container.appendChild(item);
  }
}
