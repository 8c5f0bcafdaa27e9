// Recorded agent runs: a list, and a replay of one run. Each step shows the screenshot it
// saw (its grounded point drawn), its action, the model's words and its timing. A run with a
// recording plays its video beside the steps: choosing a step seeks the video to that step's
// action, and the video, as it plays, marks the step it shows. Without a recording, Play
// steps through the screenshots.
const { params, api } = cubicle;
const $ = (id) => document.getElementById(id);
const video = $("video");
let run = null;
let current = 0;
let playing = null;

const shotUrl = (runId, index) => `/api/runs/${runId}/steps/${index}.png`;
const seconds = (ms) => (ms / 1000).toFixed(2);

function clock(ms) {
  const total = ms / 1000;
  return `${Math.floor(total / 60)}:${(total % 60).toFixed(1).padStart(4, "0")}`;
}

function where(step) {
  return step.grounded.length ? ` → (${step.grounded.map((g) => `${g.x}, ${g.y} ${g.source}`).join("; ")})` : "";
}

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

// Show step `index` (0-based): its screenshot and words, marked in the list. `seek`: move
// the video to the step's action too.
function show(index, { seek = false } = {}) {
  if (!run || !run.steps.length) return;
  current = Math.max(0, Math.min(index, run.steps.length - 1));
  const step = run.steps[current];
  $("shot").src = shotUrl(run.run.id, step.index);
  $("action").textContent = `${step.index}. ${step.action_text || step.outcome}${where(step)}`;
  $("thought").textContent = step.thought;
  const t = step.timings;
  $("timing").textContent = t ? `${seconds(t.total_ms)} s (model ${seconds(t.model_ms)} s)` : "";
  $("error").textContent = step.error || "";
  $("position").textContent = `step ${current + 1} of ${run.steps.length}`;
  document.querySelectorAll("#timeline li").forEach((item, i) => item.classList.toggle("current", i === current));
  document.querySelector("#timeline li.current")?.scrollIntoView({ block: "nearest" });
  if (seek && hasVideo() && step.video_offset_ms !== null) video.currentTime = step.video_offset_ms / 1000;
}

function hasVideo() { return !video.hidden; }

// The step the video shows at its current time: the last one whose action came before.
function stepAtVideoTime() {
  const ms = video.currentTime * 1000 + 1;
  let found = 0;
  run.steps.forEach((step, i) => { if (step.video_offset_ms !== null && step.video_offset_ms <= ms) found = i; });
  return found;
}

function followVideo() {
  if (!run || !hasVideo()) return;
  const index = stepAtVideoTime();
  if (index !== current) show(index);
}
video.addEventListener("timeupdate", followVideo);
video.addEventListener("seeked", followVideo);
video.addEventListener("play", () => { $("play").textContent = "Pause"; });
video.addEventListener("pause", () => { $("play").textContent = "Play"; });

function stepItem(step, i) {
  const item = document.createElement("li");
  item.dataset.index = step.index;
  if (step.video_offset_ms !== null) item.dataset.offset = step.video_offset_ms;
  const button = document.createElement("button");
  button.title = step.action_text || step.outcome;
  const image = Object.assign(document.createElement("img"), { loading: "lazy", alt: `screen at step ${step.index}` });
  image.src = shotUrl(run.run.id, step.index);
  const line = (className, text) => Object.assign(document.createElement("span"), { className, textContent: text });
  const t = step.timings;
  const when = [step.video_offset_ms !== null ? `at ${clock(step.video_offset_ms)}` : "",
    t ? `${seconds(t.total_ms)} s (model ${seconds(t.model_ms)} s)` : ""].filter(Boolean).join(" · ");
  button.append(image, line("what", `${step.index}. ${step.action_text || step.outcome}${where(step)}`),
    line("words", step.thought), line("when", when));
  if (step.error) button.append(line("error", step.error));
  button.onclick = () => { stop(); show(i, { seek: true }); };
  item.append(button);
  return item;
}

async function open(runId) {
  stop();
  document.querySelectorAll("#run-list a").forEach((a) => a.classList.toggle("current", a.dataset.run === runId));
  run = await api("GET", `/api/runs/${runId}`);
  $("run").hidden = false;
  $("task").textContent = run.run.task;
  $("outcome").textContent = `${run.run.status}${run.run.reason ? `: ${run.run.reason}` : ""}`;
  $("outcome").className = `status-${run.run.status}`;
  const { desktop_id: desktop, recording_id: recording } = run.run;
  video.hidden = !recording;
  if (recording) video.src = `/api/desktops/${desktop}/recordings/${recording}.mp4`;
  else video.removeAttribute("src");
  $("timeline").replaceChildren(...run.steps.map(stepItem));
  show(0);
}

function stop() {
  clearInterval(playing);
  playing = null;
  if (hasVideo()) video.pause();
  $("play").textContent = "Play";
}

$("play").onclick = () => {
  if (hasVideo()) {
    if (!video.paused) return video.pause();
    if (video.ended) show(0, { seek: true });
    return video.play().catch((error) => { $("status").textContent = error.message; });
  }
  if (playing) return stop();
  if (current >= run.steps.length - 1) show(0);
  $("play").textContent = "Pause";
  playing = setInterval(() => (current >= run.steps.length - 1 ? stop() : show(current + 1)), 1000);
};
$("prev").onclick = () => { stop(); show(current - 1, { seek: true }); };
$("next").onclick = () => { stop(); show(current + 1, { seek: true }); };
window.onpopstate = () => params.get("run") && open(new URLSearchParams(location.search).get("run"));

showList()
  .then(() => { const wanted = new URLSearchParams(location.search).get("run"); if (wanted) open(wanted); })
  .catch((error) => { $("status").textContent = error.message; });
