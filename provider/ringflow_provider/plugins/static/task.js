// The "Training" tab of a task instance: each try's loss curve (a resumed try joined to the
// one before at its resume step), learning rate and samples/s on demand, the summary once the
// task ended, each failed try's cause. Polls while the task runs.
"use strict";

const POLL_MS = 3000;
const query = new URLSearchParams(window.location.search);
const dagId = query.get("dag_id"), runId = query.get("run_id"), taskId = query.get("task_id");
const mapIndex = /^\d+$/.test(query.get("map_index") || "") ? Number(query.get("map_index")) : -1;
const SUMMARY_ROWS = [
  ["final loss", s => fmt(s.final_loss, 5)],
  ["steps", s => fmt(s.steps, 9)],
  ["world size", s => fmt(s.world_size, 6)],
  ["layout (mp × dp)", s => `mp ${s.mp_degree} × dp ${s.dp_degree}`],
  ["samples/s", s => fmt(s.samples_per_s, 5)],
  ["checkpoint", s => s.checkpoint || "–"],
  ["resumed from step", s => s.resumed_from === null || s.resumed_from === undefined
                               ? "– (started at step 1)" : String(s.resumed_from)],
];
let latest = null;

function apiPath() {
  const enc = encodeURIComponent;
  return `api/metrics/${enc(dagId)}/${enc(runId)}/${enc(taskId)}?map_index=${mapIndex}`;
}

function trySeries(tries, field) {
  const series = [];
  let before = [];  // the points of the tries so far
  tries.forEach((t, i) => {
    const points = t.points.filter(p => typeof p[field] === "number").map(p => [p.step, p[field]]);
    const s = {name: `try ${t.try_number}`, color: PALETTE[i % PALETTE.length], points};
    if (points.length && before.length) {
      // a try that resumed (or re-attached) goes on from the last step before its first
      const joinAt = before.filter(p => p[0] < points[0][0]).pop();
      if (joinAt) s.join = joinAt;
    }
    before = before.filter(p => !points.length || p[0] < points[0][0]).concat(points);
    series.push(s);
  });
  return series;
}

function render() {
  if (!latest) return;
  const tries = latest.tries;
  const logY = document.getElementById("log-scale").checked;
  const markers = tries.filter(t => t.resumed_from !== null && t.resumed_from !== undefined)
    .map(t => ({x: t.resumed_from, label: `try ${t.try_number} resumes at step ${t.resumed_from}`}));
  const lossSeries = trySeries(tries, "loss");
  legend(document.getElementById("legend"), lossSeries.filter(s => s.points.length));
  lineChart(document.getElementById("loss-chart"), {
    title: "training loss", xLabel: "step", yLabel: "loss (nats)", logY, series: lossSeries,
    markers, readout: document.getElementById("readout"),
    empty: latest.operator && latest.operator !== "TPTrainOperator"
      ? `${taskId} is a ${latest.operator} task: no training to show` : "no progress logged yet"});
  for (const [box, field, label] of [["show-lr", "lr", "learning rate"],
                                     ["show-rate", "samples_per_s", "samples/s"]]) {
    const chart = document.getElementById(box === "show-lr" ? "lr-chart" : "rate-chart");
    chart.hidden = !document.getElementById(box).checked;
    if (!chart.hidden) {
      lineChart(chart, {title: label, xLabel: "step", yLabel: label,
                        series: trySeries(tries, field), markers,
                        readout: document.getElementById("readout")});
    }
  }
  renderStatus();
  renderFailures(tries);
  renderSummary(latest.summary);
}

function renderStatus() {
  const status = document.getElementById("status");
  const tries = latest.tries;
  const last = tries[tries.length - 1];
  if (!last) { status.textContent = `state ${latest.state || "none"}: not started yet`; return; }
  const point = last.points[last.points.length - 1];
  const at = point ? ` · step ${point.step}, loss ${fmt(point.loss)}` : "";
  const more = ACTIVE_STATES.has(latest.state) ? " · updating every 3 s" : "";
  status.textContent = `try ${last.try_number} of ${tries.length}: ${latest.state}${at}${more}`;
}

function renderFailures(tries) {
  const box = document.getElementById("failures");
  box.replaceChildren();
  for (const t of tries) {
    if (!t.failure) continue;
    box.appendChild(el("div", {class: "failure", "data-try": t.try_number},
                       `try ${t.try_number} failed${t.hostname ? ` (worker ${t.hostname})` : ""}: `
                       + t.failure));
  }
}

function renderSummary(summary) {
  const box = document.getElementById("summary");
  box.replaceChildren();
  if (!summary) return;
  box.appendChild(el("h3", {}, "Summary"));
  const table = el("table", {id: "summary-table"});
  for (const [label, value] of SUMMARY_ROWS) {
    const row = el("tr");
    row.append(el("th", {}, label), el("td", {}, value(summary)));
    table.appendChild(row);
  }
  box.appendChild(table);
}

async function poll() {
  try {
    latest = await getJSON(apiPath());
    render();
  } catch (error) {
    document.getElementById("status").textContent = `could not read the training: ${error.message}`;
    if (error.status === 403 || error.status === 404 || error.status === 422) return;
  }
  if (!latest || ACTIVE_STATES.has(latest.state)) setTimeout(poll, POLL_MS);
}

document.getElementById("heading").textContent =
  `Training of ${taskId}${mapIndex >= 0 ? ` [${mapIndex}]` : ""} · ${runId}`;
for (const id of ["log-scale", "show-lr", "show-rate"]) {
  document.getElementById(id).addEventListener("change", render);
}
followColourMode(render);
poll();
