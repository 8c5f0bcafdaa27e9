// Evaluation runs: the list, one run's report (rate with its 95 % interval, pass@k, per
// domain, per task with links to each attempt's replay, time and steps histograms), and two
// runs side by side (?a=…&b=…) with the tasks that flipped. A running run refreshes itself.
"use strict";

const { params, api } = cubicle;
const $ = (id) => document.getElementById(id);
const FINAL = ["passed", "failed", "error", "unsupported"];

$("desktops-link").href = "/";
$("board-link").href = "/web/board.html";
$("evals-link").href = "/web/evals.html";

const percent = (value) => (value === null || value === undefined ? "–" : `${(value * 100).toFixed(1)} %`);
const say = (text) => { $("status").textContent = text; };

function cell(row, text, className) {
  const td = document.createElement("td");
  if (text instanceof Node) td.append(text); else td.textContent = text ?? "";
  if (className) td.className = className;
  row.append(td);
  return td;
}

function link(text, href) {
  const a = document.createElement("a");
  a.textContent = text;
  a.href = href;
  return a;
}

function fill(tbody, rows, build) {
  tbody.replaceChildren(...rows.map((item) => { const tr = document.createElement("tr"); build(tr, item); return tr; }));
}

// --- the list --------------------------------------------------------------------------------

async function showList() {
  const runs = await api("GET", "/api/evals");
  $("list").hidden = false;
  say(`${runs.length} run(s)`);
  const picked = new Set();
  fill($("runs").tBodies[0], runs, (tr, run) => {
    const box = document.createElement("input");
    box.type = "checkbox";
    box.setAttribute("aria-label", `pick ${run.name}`);
    box.onchange = () => {
      if (box.checked) picked.add(run.id); else picked.delete(run.id);
      $("compare").disabled = picked.size !== 2;
    };
    cell(tr, box);
    cell(tr, link(run.name, `/web/evals.html?run=${run.id}`));
    cell(tr, run.status, `s-${run.status}`);
    cell(tr, run.model || run.profile);
    const scored = ["passed", "failed", "error"].reduce((n, s) => n + (run.counts[s] || 0), 0);
    cell(tr, scored ? percent((run.counts.passed || 0) / scored) : "–", "num");
    cell(tr, String(run.tasks), "num");
    cell(tr, new Date(run.created_at).toLocaleString());
  });
  $("compare").onclick = () => {
    const [a, b] = [...picked];
    location.href = `/web/evals.html?a=${a}&b=${b}`;
  };
}

// --- one run ---------------------------------------------------------------------------------

function histogram(svg, values, bins = 10) {
  const width = 360, height = 160, left = 28, bottom = 20;
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  if (!values.length) { svg.innerHTML = `<text x="10" y="20">no finished attempts yet</text>`; return; }
  const low = Math.min(...values), high = Math.max(...values);
  const size = (high - low) / bins || 1;
  const counts = new Array(bins).fill(0);
  for (const value of values) counts[Math.min(bins - 1, Math.floor((value - low) / size))] += 1;
  const top = Math.max(...counts);
  const barWidth = (width - left) / bins;
  const bars = counts.map((count, i) => {
    const h = (count / top) * (height - bottom - 10);
    return `<rect x="${left + i * barWidth + 1}" y="${height - bottom - h}" width="${barWidth - 2}" height="${h}"><title>${count}</title></rect>`;
  });
  const fmt = (v) => (Math.abs(v) >= 100 ? v.toFixed(0) : v.toFixed(1));
  svg.innerHTML = bars.join("")
    + `<text x="${left}" y="${height - 5}">${fmt(low)}</text>`
    + `<text x="${width - 30}" y="${height - 5}">${fmt(high)}</text>`
    + `<text x="2" y="12">${top}</text>`;
}

function controls(run) {
  const box = $("controls");
  const button = document.createElement("button");
  if (run.status === "running") {
    button.textContent = "Stop";
    button.onclick = () => api("POST", `/api/evals/${run.id}/stop`).then(() => showReport(run.id));
  } else if (run.status === "stopped") {
    button.textContent = "Resume";
    button.onclick = () => api("POST", `/api/evals/${run.id}/resume`).then(() => showReport(run.id));
  } else {
    box.replaceChildren(link("Download JSON", `/api/evals/${run.id}`));
    return;
  }
  box.replaceChildren(button, link("Download JSON", `/api/evals/${run.id}`));
}

let refresh = null;

async function showReport(runId) {
  const report = await api("GET", `/api/evals/${runId}`);
  const { run, summary } = report;
  $("report").hidden = false;
  document.title = `Cubicle · ${run.name}`;
  $("name").textContent = run.name;
  $("meta").textContent = `${run.status} · ${run.suite} · model ${run.model || "?"} (profile ${run.profile})`
    + ` · ${run.attempts} attempt(s) per task, ${run.concurrency} at once`;
  $("rate").textContent = percent(summary.rate);
  $("interval").textContent = summary.ci_low === null ? ""
    : `95 % CI ${percent(summary.ci_low)} – ${percent(summary.ci_high)}`;
  const numbers = [
    ["passed", `${summary.passed} of ${summary.scored} scored`],
    ["failed", summary.failed], ["errors", summary.errors],
    ["unsupported", `${summary.unsupported} task(s)`], ["pending", summary.pending],
    ["mean score", summary.mean_score === null ? "–" : summary.mean_score.toFixed(3)],
    ...Object.entries(summary.pass_at).map(([k, v]) => [`pass@${k}`, percent(v)]),
  ];
  $("numbers").replaceChildren(...numbers.flatMap(([label, value]) => {
    const dt = document.createElement("dt"); dt.textContent = label;
    const dd = document.createElement("dd"); dd.textContent = value;
    return [dt, dd];
  }));
  controls(run);
  fill($("domains").tBodies[0], report.domains, (tr, row) => {
    cell(tr, row.domain);
    cell(tr, String(row.tasks), "num");
    cell(tr, String(row.passed), "num");
    cell(tr, String(row.scored), "num");
    cell(tr, percent(row.rate), "num");
  });
  fill($("items").tBodies[0], report.items, (tr, item) => {
    tr.dataset.task = item.task_id;
    cell(tr, item.task_id);
    cell(tr, item.domain);
    cell(tr, String(item.attempt), "num");
    cell(tr, item.status, `s-${item.status}`);
    cell(tr, item.score === null ? "" : item.score.toFixed(2), "num");
    cell(tr, item.steps === null ? "" : String(item.steps), "num");
    cell(tr, item.wall_s === null ? "" : `${item.wall_s.toFixed(1)} s`, "num");
    const tokens = item.prompt_tokens === null ? "" : `${item.prompt_tokens} + ${item.completion_tokens ?? 0}`;
    cell(tr, tokens, "num");
    const replay = document.createElement("span");
    if (item.agent_run_id) replay.append(link("steps", `/web/runs.html?run=${item.agent_run_id}`));
    if (item.recording_id && item.desktop_id) {
      replay.append(" · ", link("video", `/api/desktops/${item.desktop_id}/recordings/${item.recording_id}.mp4`));
    }
    cell(tr, replay);
    cell(tr, item.detail || "", "detail");
  });
  const done = report.items.filter((i) => FINAL.includes(i.status) && i.wall_s !== null);
  histogram($("time-plot"), done.map((i) => i.wall_s));
  histogram($("steps-plot"), done.filter((i) => i.steps !== null).map((i) => i.steps));
  say(run.status === "running" ? "running: refreshing" : run.status);
  clearTimeout(refresh);
  if (run.status === "running") refresh = setTimeout(() => showReport(runId).catch((e) => say(e.message)), 2000);
}

// --- two runs --------------------------------------------------------------------------------

async function showComparison(a, b) {
  const c = await api("GET", `/api/evals/compare?a=${encodeURIComponent(a)}&b=${encodeURIComponent(b)}`);
  $("comparison").hidden = false;
  $("a-name").replaceChildren(link(c.a.name, `/web/evals.html?run=${c.a.id}`));
  $("b-name").replaceChildren(link(c.b.name, `/web/evals.html?run=${c.b.id}`));
  $("a-head").textContent = c.a.name;
  $("b-head").textContent = c.b.name;
  const rows = [
    ["Success rate", percent(c.a_summary.rate), percent(c.b_summary.rate)],
    ["95 % CI", `${percent(c.a_summary.ci_low)} – ${percent(c.a_summary.ci_high)}`,
      `${percent(c.b_summary.ci_low)} – ${percent(c.b_summary.ci_high)}`],
    ["Passed / scored", `${c.a_summary.passed} / ${c.a_summary.scored}`, `${c.b_summary.passed} / ${c.b_summary.scored}`],
    ["Model", c.a.model || c.a.profile, c.b.model || c.b.profile],
  ];
  fill($("sides").tBodies[0], rows, (tr, [label, x, y]) => { cell(tr, label); cell(tr, x); cell(tr, y); });
  $("flipped-title").textContent = `Flipped tasks: ${c.flipped.length} of ${c.common} in common`
    + ` (both passed ${c.both_passed}, both failed ${c.both_failed})`;
  fill($("flipped").tBodies[0], c.flipped, (tr, flip) => {
    tr.dataset.task = flip.task_id;
    cell(tr, flip.task_id);
    cell(tr, flip.domain);
    cell(tr, flip.a, `s-${flip.a}`);
    cell(tr, flip.b, `s-${flip.b}`);
  });
  say("comparison");
}

const run = params.get("run");
const [a, b] = [params.get("a"), params.get("b")];
(run ? showReport(run) : a && b ? showComparison(a, b) : showList()).catch((error) => say(error.message));
