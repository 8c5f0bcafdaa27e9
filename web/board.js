// The task board: add tasks, watch them move Queued → Running → Done/Failed, live.
// Columns load a page at a time (the queue may hold thousands); server-sent events keep
// the cards current. Requests carry the page's cookie (see api.js): no URL holds the token.
"use strict";

const { api } = cubicle;
const $ = (selector, root = document) => root.querySelector(selector);

const COLUMNS = {
  queued: ["queued"],
  running: ["running", "paused"],
  done: ["done"],
  failed: ["failed", "cancelled", "interrupted"],
};
const PAGE = 50;
const cards = new Map();   // task id → {node, task}
const loaded = {};         // column → tasks shown


function say(text) { $("#status").textContent = text; }

function columnOf(status) {
  return Object.keys(COLUMNS).find((name) => COLUMNS[name].includes(status));
}

function listOf(column) { return $(`[data-column="${column}"] .cards`); }

// --- cards -----------------------------------------------------------------------------------

function actionsFor(task) {
  const id = task.id;
  const post = (what) => () => api("POST", `/api/tasks/${id}/${what}`);
  switch (task.status) {
    case "queued": return [
      ["Edit", () => edit(id)],
      ["↑", () => moveBy(id, -1), "Move up"],
      ["↓", () => moveBy(id, +1), "Move down"],
      ["Top", () => api("POST", `/api/tasks/${id}/move`, { to: "top" })],
      ["Cancel", post("cancel")],
      ["Delete", () => api("DELETE", `/api/tasks/${id}`)],
    ];
    case "running": return [["Pause", post("pause")], ["Cancel", post("cancel")]];
    case "paused": return [
      ["Resume", post("resume")], ["Mark done", post("done")], ["Cancel", post("cancel")],
    ];
    case "done": return [["Delete", () => api("DELETE", `/api/tasks/${id}`)]];
    default: return [["Retry", post("retry")], ["Delete", () => api("DELETE", `/api/tasks/${id}`)]];
  }
}

function render(task) {
  let entry = cards.get(task.id);
  if (!entry) {
    const node = $("#card").content.firstElementChild.cloneNode(true);
    node.dataset.id = task.id;
    $(".timeline-box", node).addEventListener("toggle", () => loadSteps(task.id));
    $(".enlarge", node).onclick = () => enlarge(cards.get(task.id).task);
    const replay = $(".recording", node);
    replay.addEventListener("timeupdate", () => markPlayedStep(node));
    replay.addEventListener("seeked", () => markPlayedStep(node));
    entry = { node, task, stepsFor: null };
    cards.set(task.id, entry);
  }
  const { node } = entry;
  const previous = entry.task;
  entry.task = task;
  node.dataset.status = task.status;
  $(".id", node).textContent = `#${task.id}`;
  $(".badge", node).textContent = task.status;
  $(".badge", node).className = `badge ${task.status}`;
  const meta = [task.profile !== "default" ? task.profile : "", task.start ? `starts ${task.start}` : ""];
  if (task.steps) meta.push(`${task.steps} step${task.steps === 1 ? "" : "s"}`);
  if (task.tag) meta.push(task.tag.split(":").slice(1).join(" · "));
  $(".meta", node).textContent = meta.filter(Boolean).join(" · ");
  if (!node.classList.contains("editing")) $(".text", node).textContent = task.text;
  $(".result", node).textContent = task.result || "";

  const live = ["running", "paused"].includes(task.status) && task.desktop_id;
  const frame = $(".live iframe", node);
  $(".live", node).hidden = !live;
  if (live && frame.dataset.desktop !== task.desktop_id) {
    frame.dataset.desktop = task.desktop_id;
    frame.src = `/view/${task.desktop_id}?embed=1`;
  } else if (!live && frame.dataset.desktop) {
    frame.removeAttribute("src");
    delete frame.dataset.desktop;
  }
  const video = $(".recording", node);
  const finished = columnOf(task.status) !== "queued" && !live;
  video.hidden = !(finished && task.recording_id && task.desktop_id);
  if (!video.hidden && !video.src) {
    video.src = `/api/desktops/${task.desktop_id}/recordings/${task.recording_id}.mp4`;
  }
  const timeline = $(".timeline-box", node);
  timeline.hidden = !task.run_id;
  $(".step-count", node).textContent = task.steps ? `(${task.steps})` : "";
  if (task.status === "running" && !timeline.open) timeline.open = true;
  else if (timeline.open && previous.run_id !== task.run_id) loadSteps(task.id);

  const actions = $(".actions", node);
  if (node.classList.contains("editing")) return node;
  actions.replaceChildren(...actionsFor(task).map(([label, run, title]) => {
    const b = document.createElement("button");
    b.textContent = label;
    if (title) b.title = title;
    b.onclick = () => act(b, run);
    return b;
  }));
  return node;
}

async function act(button, run) {
  button.disabled = true;
  try {
    await run();
    say("");
  } catch (error) {
    say(error.message);
  } finally {
    button.disabled = false;
  }
}

// Put a card in its column: the queue in queue order, running ones oldest first, finished
// ones newest first.
function place(node, task) {
  const column = columnOf(task.status);
  const list = listOf(column);
  if (column === "queued") {
    const after = [...list.children].find((n) => n !== node && cards.get(+n.dataset.id).task.position > task.position);
    if (after) list.insertBefore(node, after); else list.append(node);
  } else if (column === "running") {
    if (node.parentElement !== list) list.append(node);
  } else if (node.parentElement !== list) {
    list.prepend(node);
  }
}

// Events, answers and column loads may arrive out of order: a copy of a task older than
// the one shown is ignored (every change to a task counts its version up).
function isStale(task) {
  const entry = cards.get(task.id);
  return entry !== undefined && entry.task.version > task.version;
}

function upsert(task) {
  if (isStale(task)) return;
  const known = cards.has(task.id);
  const column = columnOf(task.status);
  const list = listOf(column);
  // A task beyond the loaded part of the queue stays unloaded until "Show more".
  if (!known && column === "queued" && loaded.queued >= PAGE && list.lastElementChild) {
    const last = cards.get(+list.lastElementChild.dataset.id).task;
    if (task.position > last.position) return;
  }
  place(render(task), task);
}

function remove(id) {
  const entry = cards.get(id);
  if (entry) { entry.node.remove(); cards.delete(id); }
}

async function loadSteps(id) {
  const entry = cards.get(id);
  if (!entry || !$(".timeline-box", entry.node).open || !entry.task.run_id) return;
  if (entry.stepsFor === entry.task.run_id) return;
  entry.stepsFor = entry.task.run_id;
  const steps = await api("GET", `/api/tasks/${id}/steps`);
  $(".timeline", entry.node).replaceChildren();
  steps.forEach((step) => addStep(step));
}

function addStep(step) {
  const entry = cards.get(step.task_id);
  if (!entry || entry.stepsFor !== step.run_id) return;
  const list = $(".timeline", entry.node);
  if ($(`[data-index="${step.index}"]`, list)) return;
  const item = document.createElement("li");
  item.dataset.index = step.index;
  if (step.screenshot) {
    const img = document.createElement("img");
    img.alt = `screen at step ${step.index}`;
    img.loading = "lazy";
    let tries = 0;
    img.onerror = () => { if (tries++ < 5) setTimeout(() => { img.src = `${step.screenshot}?t=${tries}`; }, 400); };
    img.src = step.screenshot;
    item.append(img);
  }
  const text = document.createElement("span");
  const where = step.x !== null ? ` → (${step.x}, ${step.y}) ${step.source}` : "";
  text.textContent = `${step.index}. ${step.action || "no action"}${where} · ${(step.total_ms / 1000).toFixed(1)} s`;
  item.append(text);
  if (step.thought) item.append(Object.assign(document.createElement("q"), { textContent: step.thought }));
  if (step.video_offset_ms !== null && step.video_offset_ms !== undefined) {
    // A finished task's recording plays above its steps: a step seeks it to its action.
    item.dataset.offset = step.video_offset_ms;
    item.classList.add("seekable");
    item.title = "show this step in the recording";
    item.onclick = () => seek($(".recording", entry.node), step.video_offset_ms);
  }
  if (step.error) {
    const error = document.createElement("em");
    error.textContent = step.error;
    item.append(error);
  }
  list.append(item);
}

// Move a card's recording to `ms`; a video not loaded yet (preload="none") loads first.
function seek(replay, ms) {
  if (replay.hidden) return;
  const go = () => { replay.currentTime = ms / 1000; };
  if (replay.readyState >= HTMLMediaElement.HAVE_METADATA) return go();
  replay.addEventListener("loadedmetadata", go, { once: true });
  replay.preload = "metadata";
  replay.load();
}

// Mark the step a card's recording shows now: the last one whose action came before.
function markPlayedStep(node) {
  const ms = $(".recording", node).currentTime * 1000 + 1;
  let shown = null;
  for (const item of node.querySelectorAll(".timeline li[data-offset]")) {
    if (+item.dataset.offset <= ms) shown = item;
  }
  node.querySelectorAll(".timeline li.current").forEach((item) => { if (item !== shown) item.classList.remove("current"); });
  if (shown) shown.classList.add("current");
}

function edit(id) {
  const { node, task } = cards.get(id);
  node.classList.add("editing");
  const area = document.createElement("textarea");
  area.value = task.text;
  area.rows = 3;
  const done = () => { node.classList.remove("editing"); render(cards.get(id).task); };
  const save = document.createElement("button");
  save.textContent = "Save";
  save.onclick = () => act(save, async () => {
    const updated = await api("PATCH", `/api/tasks/${id}`, { text: area.value });
    cards.get(id).task = updated;
    done();
  });
  const cancel = document.createElement("button");
  cancel.textContent = "Keep";
  cancel.onclick = done;
  $(".text", node).replaceChildren(area);
  $(".actions", node).replaceChildren(save, cancel);
  area.focus();
}

async function moveBy(id, delta) {
  const node = cards.get(id).node;
  const neighbour = delta < 0 ? node.previousElementSibling : node.nextElementSibling;
  if (!neighbour) return;
  const where = delta < 0 ? { before: +neighbour.dataset.id } : { after: +neighbour.dataset.id };
  await api("POST", `/api/tasks/${id}/move`, where);
}

function enlarge(task) {
  const box = $("#enlarged");
  $("iframe", box).src = `/view/${task.desktop_id}?embed=1`;
  box.hidden = false;
}
$("#shrink").onclick = () => { $("#enlarged").hidden = true; $("#enlarged iframe").removeAttribute("src"); };

// --- columns -------------------------------------------------------------------------------

async function loadColumn(column, more = false) {
  const offset = more ? loaded[column] : 0;
  const page = await api("GET", `/api/tasks?status=${COLUMNS[column].join(",")}&offset=${offset}&limit=${PAGE}`);
  if (!more) {
    for (const node of [...listOf(column).children]) node.remove();
  }
  for (const task of page.items) {
    if (isStale(task)) {
      const { node, task: newer } = cards.get(task.id);
      place(node, newer);
    } else {
      listOf(column).append(render(task));
    }
  }
  loaded[column] = offset + page.items.length;
  showTotal(column, page.total);
}

// A column's count, and its "Show more" button while some of its tasks are not loaded.
function showTotal(column, total) {
  const section = $(`[data-column="${column}"]`);
  $(".count", section).textContent = total;
  $(".more", section).hidden = loaded[column] >= total;
  $(".more", section).textContent = `Show more (${total - loaded[column]} left)`;
}

async function loadAll() {
  await Promise.all(Object.keys(COLUMNS).map((column) => loadColumn(column)));
}

let countsTimer = null;
function refreshCounts() {
  clearTimeout(countsTimer);
  countsTimer = setTimeout(async () => {
    const counts = await api("GET", "/api/tasks/counts");
    for (const [column, statuses] of Object.entries(COLUMNS)) {
      loaded[column] = listOf(column).children.length;
      showTotal(column, statuses.reduce((sum, s) => sum + (counts[s] || 0), 0));
    }
  }, 150);
}

let reloadTimer = null;
function reloadSoon() {
  clearTimeout(reloadTimer);
  reloadTimer = setTimeout(() => loadAll().catch((e) => say(e.message)), 300);
}

for (const section of document.querySelectorAll(".column")) {
  $(".more", section).onclick = () => loadColumn(section.dataset.column, true).catch((e) => say(e.message));
}

function listen() {
  const events = new EventSource("/api/tasks/events");
  // Whatever changed before this (re)connection was not heard: load everything afresh.
  events.addEventListener("hello", () => {
    say("");
    Promise.all([loadAll(), loadSettings(), loadProfiles()]).catch((e) => say(e.message));
  });
  events.addEventListener("task", (e) => { upsert(JSON.parse(e.data).task); refreshCounts(); });
  events.addEventListener("moved", (e) => { const { task } = JSON.parse(e.data); if (cards.has(task.id)) upsert(task); });
  events.addEventListener("step", (e) => addStep(JSON.parse(e.data).step));
  events.addEventListener("deleted", (e) => { remove(JSON.parse(e.data).id); refreshCounts(); });
  events.addEventListener("bulk", reloadSoon);
  events.addEventListener("settings", loadSettings);
  events.onerror = () => say("reconnecting…");
}

// --- the form, settings and profiles -------------------------------------------------------

$("#add").onsubmit = async (event) => {
  event.preventDefault();
  const body = { text: $("#text").value, profile: $("#profile").value || "default" };
  if ($("#start").value.trim()) body.start = $("#start").value.trim();
  $("#form-error").textContent = "";
  try {
    const task = await api("POST", "/api/tasks", body);
    upsert(task);
    refreshCounts();
    $("#text").value = "";
    $("#start").value = "";
  } catch (error) {
    $("#form-error").textContent = error.message;
  }
};
$("#text").addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("#add").requestSubmit(); });

async function loadSettings() {
  const settings = await api("GET", "/api/board/settings");
  const form = $("#settings-form");
  for (const name of ["concurrency", "max_steps", "max_wall_s", "keep_desktop_s"]) form.elements[name].value = settings[name];
  form.elements.record.checked = settings.record;
}

$("#settings-form").onsubmit = async (event) => {
  event.preventDefault();
  const form = event.target;
  const current = await api("GET", "/api/board/settings");
  const number = (name) => Number(form.elements[name].value);
  try {
    await api("PUT", "/api/board/settings", {
      ...current,
      concurrency: number("concurrency"),
      max_steps: number("max_steps"),
      max_wall_s: number("max_wall_s"),
      keep_desktop_s: number("keep_desktop_s"),
      record: form.elements.record.checked,
    });
    $("#settings-status").textContent = "Settings saved.";
  } catch (error) {
    $("#settings-status").textContent = error.message;
  }
};

async function loadProfiles() {
  const profiles = await api("GET", "/api/board/profiles");
  const select = $("#profile");
  const chosen = select.value;
  select.replaceChildren(...profiles.map((p) => new Option(p.ready ? p.name : `${p.name} (not ready)`, p.name)));
  if (chosen) select.value = chosen;
  $("#profiles").replaceChildren(...profiles.map((p) => {
    const item = document.createElement("li");
    const model = p.planner_model || "model from the environment";
    item.textContent = `${p.name}: ${model}${p.grounder ? `, grounders ${p.grounder}` : ""}${p.ready ? "" : ` — ${p.problem}`}`;
    return item;
  }));
}

$("#profile-form").onsubmit = async (event) => {
  event.preventDefault();
  const form = event.target;
  const body = {};
  for (const name of ["base_url", "api_key", "planner_model", "grounder"]) {
    if (form.elements[name].value.trim()) body[name] = form.elements[name].value.trim();
  }
  try {
    await api("PUT", `/api/board/profiles/${encodeURIComponent(form.elements.name.value.trim())}`, body);
    $("#settings-status").textContent = "Profile saved.";
    form.reset();
    await loadProfiles();
  } catch (error) {
    $("#settings-status").textContent = error.message;
  }
};

listen();
