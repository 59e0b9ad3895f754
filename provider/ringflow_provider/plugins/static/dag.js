// The "Training runs" tab of a DAG: the loss curves of its newest runs overlaid (one colour a
// run) and a table of each run's conf (the params that differ between the runs shown are
// highlighted), final loss, samples/s and duration. A click on a run opens its task's tab.
"use strict";

const POLL_MS = 5000;
const dagId = new URLSearchParams(window.location.search).get("dag_id");
let shown = [];      // [{run, points}] in the table's order (newest first)
let timer = null;

async function curveOf(run) {
  // a finished run's history is in its XCom; a running or failed one's in its log records
  if (Array.isArray(run.loss_history) && run.loss_history.length) return run.loss_history;
  if (!run.task_id) return [];
  const enc = encodeURIComponent;
  try {
    const data = await getJSON(`api/metrics/${enc(dagId)}/${enc(run.run_id)}/`
                               + `${enc(run.task_id)}?map_index=${run.map_index ?? -1}`);
    const byStep = new Map();
    for (const t of data.tries) for (const p of t.points) byStep.set(p.step, p.loss);
    return [...byStep.entries()].sort((a, b) => a[0] - b[0]);
  } catch (error) {
    return [];
  }
}

function differing(runs) {
  const keys = [...new Set(runs.flatMap(r => Object.keys(r.conf || {})))].sort();
  const differs = new Set(keys.filter(k => new Set(runs.map(
    r => JSON.stringify((r.conf || {})[k] ?? null))).size > 1));
  return {keys: [...keys.filter(k => differs.has(k)), ...keys.filter(k => !differs.has(k))],
          differs};
}

function render() {
  const logY = document.getElementById("log-scale").checked;
  const series = shown.map((s, i) => ({name: s.run.run_id, color: PALETTE[i % PALETTE.length],
                                       points: s.points}));
  lineChart(document.getElementById("loss-chart"), {
    title: "training loss by run", xLabel: "step", yLabel: "loss (nats)", logY, series,
    readout: document.getElementById("readout"), empty: "no training run with progress yet"});
  renderTable(series);
}

function renderTable(series) {
  const table = document.getElementById("runs");
  table.replaceChildren();
  const runs = shown.map(s => s.run);
  const {keys, differs} = differing(runs);
  const head = el("tr");
  for (const label of ["", "run", "state", "final loss", "samples/s", "duration"]) {
    head.appendChild(el("th", {}, label));
  }
  for (const key of keys) {
    head.appendChild(el("th", {class: differs.has(key) ? "differs" : "same",
                               "data-param": key}, key));
  }
  const thead = el("thead");
  thead.appendChild(head);
  const body = el("tbody");
  runs.forEach((run, i) => {
    const row = el("tr", {class: "run", "data-run-id": run.run_id,
                          title: run.task_id ? `open the training of ${run.task_id}` : ""});
    const swatch = el("span", {class: "swatch"});
    swatch.style.background = series[i].color;
    const first = el("td");
    first.appendChild(swatch);
    row.appendChild(first);
    row.append(el("td", {}, run.run_id), el("td", {}, run.state),
               el("td", {}, fmt(run.final_loss, 5)), el("td", {}, fmt(run.samples_per_s, 5)),
               el("td", {}, fmtDuration(run.duration_s)));
    for (const key of keys) {
      const value = (run.conf || {})[key];
      row.appendChild(el("td", {class: differs.has(key) ? "differs" : "same", "data-param": key},
                         value === undefined ? "–" : JSON.stringify(value)));
    }
    if (run.task_id) {
      row.addEventListener("click", () => {
        openInUi(taskTabUrl(dagId, run.run_id, run.task_id, run.map_index));
      });
    }
    body.appendChild(row);
  });
  table.append(thead, body);
}

async function load() {
  clearTimeout(timer);
  const limit = document.getElementById("limit").value;
  const status = document.getElementById("status");
  try {
    const data = await getJSON(`api/runs/${encodeURIComponent(dagId)}?limit=${limit}`);
    const withTraining = data.runs.filter(r => r.task_id);
    const points = await Promise.all(withTraining.map(curveOf));
    shown = withTraining.map((run, i) => ({run, points: points[i]}));
    status.textContent = `${shown.length} run${shown.length === 1 ? "" : "s"} with training`;
    render();
    // a run the scheduler has not given its tasks yet has no training to show, but will
    if (data.runs.some(r => ACTIVE_STATES.has(r.state))
        || withTraining.some(r => ACTIVE_STATES.has(r.task_state))) timer = setTimeout(load, POLL_MS);
  } catch (error) {
    status.textContent = `could not read the runs: ${error.message}`;
  }
}

document.getElementById("heading").textContent = `Training runs of ${dagId}`;
const asked = new URLSearchParams(window.location.search).get("limit");
if (asked && [...document.getElementById("limit").options].some(o => o.value === asked)) {
  document.getElementById("limit").value = asked;
}
document.getElementById("limit").addEventListener("change", load);
document.getElementById("log-scale").addEventListener("change", render);
followColourMode(() => { if (shown.length) render(); });
load();
