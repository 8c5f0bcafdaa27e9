// Recorded agent runs: a list, and a player that steps through a run's screenshots
// (grounded points drawn on them) with each step's action, thought and timings.
const { params, api } = cubicle;
const $ = (id) => document.getElementById(id);
let run = null;
let current = 0;
let playing = null;

const shotUrl = (runId, index) => `/api/runs/${runId}/steps/${index}.png`;

async function showList() {
  const runs = await api("GET", "/api/runs");
  $("status").textContent = `${runs.length} run(s)`;
  $("run-list").replaceChildren(...runs.map((r) => {
    const link = document.createElement("a");
    link.href = `?run=${r.id}`;
    link.dataset.run = r.id;
    link.innerHTML = `<span class="task"></span><small class="status-${r.status}"></small>`;
    link.querySelector(".task").textContent = r.task;
    link.querySelector("small").textContent = `${r.status} · ${r.steps} step(s) · ${new Date(r.started_at).toLocaleString()}`;
    link.onclick = (event) => { event.preventDefault(); history.pushState(null, "", link.href); open(r.id); };
    return link;
  }));
}

function show(index) {
  if (!run || !run.steps.length) return;
  current = Math.max(0, Math.min(index, run.steps.length - 1));
  const step = run.steps[current];
  $("shot").src = shotUrl(run.run.id, step.index);
  $("action").textContent = `${step.index}. ${step.action_text || step.outcome}`
    + (step.grounded.length ? ` → (${step.grounded.map((g) => `${g.x}, ${g.y} ${g.source}`).join("; ")})` : "");
  $("thought").textContent = step.thought;
  const t = step.timings;
  $("timing").textContent = t ? `${(t.total_ms / 1000).toFixed(2)} s (model ${(t.model_ms / 1000).toFixed(2)} s)` : "";
  $("error").textContent = step.error || "";
  $("position").textContent = `step ${current + 1} of ${run.steps.length}`;
  document.querySelectorAll("#timeline button").forEach((b, i) => b.classList.toggle("current", i === current));
}

async function open(runId) {
  stop();
  document.querySelectorAll("#run-list a").forEach((a) => a.classList.toggle("current", a.dataset.run === runId));
  run = await api("GET", `/api/runs/${runId}`);
  $("run").hidden = false;
  $("task").textContent = run.run.task;
  $("outcome").textContent = `${run.run.status}${run.run.reason ? `: ${run.run.reason}` : ""}`;
  $("outcome").className = `status-${run.run.status}`;
  $("timeline").replaceChildren(...run.steps.map((step, i) => {
    const item = document.createElement("li");
    const button = document.createElement("button");
    button.title = step.action_text || step.outcome;
    button.innerHTML = `<img loading="lazy" alt="">`;
    button.querySelector("img").src = shotUrl(run.run.id, step.index);
    button.onclick = () => { stop(); show(i); };
    item.append(button);
    return item;
  }));
  show(0);
}

function stop() {
  clearInterval(playing);
  playing = null;
  $("play").textContent = "Play";
}

$("play").onclick = () => {
  if (playing) return stop();
  if (current >= run.steps.length - 1) show(0);
  $("play").textContent = "Pause";
  playing = setInterval(() => (current >= run.steps.length - 1 ? stop() : show(current + 1)), 1000);
};
$("prev").onclick = () => { stop(); show(current - 1); };
$("next").onclick = () => { stop(); show(current + 1); };
window.onpopstate = () => params.get("run") && open(new URLSearchParams(location.search).get("run"));

showList()
  .then(() => { const wanted = new URLSearchParams(location.search).get("run"); if (wanted) open(wanted); })
  .catch((error) => { $("status").textContent = error.message; });
