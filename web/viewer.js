// The live view of one desktop: WebRTC when it works, MJPEG over HTTP when it does not.
// Input (when this viewer has control) goes over the WebRTC data channel, or a WebSocket
// for MJPEG, as screen-pixel coordinates and browser key events.
"use strict";

const desktopId = decodeURIComponent(location.pathname.split("/").filter(Boolean).pop());
const { params, isShareLink, api } = cubicle;
const base = `/api/desktops/${encodeURIComponent(desktopId)}`;
const $ = (id) => document.getElementById(id);
const video = $("screen");
const img = $("mjpeg");
const stage = $("stage");

const view = {
  transport: null,   // "WebRTC" or "MJPEG"
  viewerId: null,
  controller: null,
  canControl: false,
  screen: null,      // {width, height} in screen pixels
  send: () => {},    // sends one input message to the desktop
  pc: null,
  socket: null,
};

$("desktop-id").textContent = desktopId;
// Inside another page (the task board's cards): the picture and the control buttons only.
if (params.get("embed")) document.body.classList.add("embed");
if (isShareLink) $("back").hidden = true;

function say(text) { $("status").textContent = text; }

// --- transports --------------------------------------------------------------------------

function setTransport(name, why) {
  view.transport = name;
  const badge = $("transport");
  badge.textContent = name;
  badge.className = `badge ${name.toLowerCase()}`;
  badge.title = why || `the picture arrives over ${name}`;
  video.hidden = name !== "WebRTC";
  img.hidden = name !== "MJPEG";
}

function waitFor(condition, ms, what) {
  return new Promise((resolve, reject) => {
    const started = performance.now();
    const tick = () => {
      if (condition()) return resolve();
      if (performance.now() - started > ms) return reject(new Error(`no ${what} within ${ms / 1000} s`));
      setTimeout(tick, 50);
    };
    tick();
  });
}

async function startWebRTC() {
  const pc = new RTCPeerConnection({ iceServers: [] });
  view.pc = pc;
  const transceiver = pc.addTransceiver("video", { direction: "recvonly" });
  const codecs = (RTCRtpReceiver.getCapabilities?.("video")?.codecs || [])
    .filter((c) => c.mimeType === "video/H264" || c.mimeType === "video/rtx");
  if (codecs.some((c) => c.mimeType === "video/H264") && transceiver.setCodecPreferences) {
    transceiver.setCodecPreferences(codecs);
  }
  const channel = pc.createDataChannel("input", { ordered: true });
  channel.onmessage = (event) => onMessage(JSON.parse(event.data));
  channel.onclose = () => { if (view.pc === pc) viewLost("the live view ended"); };
  pc.ontrack = (event) => {
    if ("playoutDelayHint" in event.receiver) event.receiver.playoutDelayHint = 0;
    if ("jitterBufferTarget" in event.receiver) event.receiver.jitterBufferTarget = 0;
    video.srcObject = event.streams[0] || new MediaStream([event.track]);
  };
  await pc.setLocalDescription(await pc.createOffer());
  await waitFor(() => pc.iceGatheringState === "complete", 2000, "ICE candidates").catch(() => {});
  const answer = await api("POST", `${base}/webrtc`, { type: "offer", sdp: pc.localDescription.sdp });
  view.viewerId = answer.viewer_id;
  await pc.setRemoteDescription({ type: "answer", sdp: answer.sdp });
  await waitFor(() => video.videoWidth > 0, 8000, "video over WebRTC");
  view.send = (message) => { if (channel.readyState === "open") channel.send(JSON.stringify(message)); };
  pc.onconnectionstatechange = () => {
    if (pc.connectionState === "failed" && view.pc === pc) fallBack("the WebRTC connection failed");
    if (pc.connectionState === "closed") say("the live view ended");
  };
  setTransport("WebRTC");
  video.play().catch(() => {});
}

function startMjpeg(why) {
  setTransport("MJPEG", why);
  img.src = `${base}/mjpeg`;
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const socket = new WebSocket(`${scheme}://${location.host}${base}/input`);
  view.socket = socket;
  socket.onmessage = (event) => onMessage(JSON.parse(event.data));
  socket.onclose = (event) => {
    if (view.socket === socket && (event.code >= 4000 || event.code === 1001)) viewLost(event.reason || "the live view ended");
  };
  view.send = (message) => { if (socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message)); };
}

function fallBack(why) {
  if (view.transport === "MJPEG") return;
  if (view.pc) { view.pc.close(); view.pc = null; }
  console.warn(`falling back to MJPEG: ${why}`);
  startMjpeg(`WebRTC did not work here (${why}): MJPEG over HTTP instead`);
}

async function start() {
  try {
    const live = await api("GET", `${base}/live`);
    view.screen = live.desktop.screen;
    overlay.setSize(view.screen.width, view.screen.height);
  } catch (error) {
    if (error.code === "desktop_paused") return waitForResume();
    say(error.message);
    return;
  }
  const wanted = (params.get("transport") || "auto").toLowerCase();
  if (wanted !== "mjpeg") {
    if (!window.RTCPeerConnection) {
      if (wanted === "webrtc") return say("this browser has no WebRTC");
      return startMjpeg("this browser has no WebRTC: MJPEG over HTTP instead");
    }
    try {
      await startWebRTC();
      return;
    } catch (error) {
      if (wanted === "webrtc") return say(`WebRTC failed: ${error.message}`);
      return fallBack(error.message);
    }
  }
  startMjpeg("asked for with ?transport=mjpeg");
}

// --- a paused desktop: the page waits, and opens a new view once it runs again ----------
// Paused with its memory, the stream stays open and shows a still screen; paused without
// (or parked by a stopping service), the service hangs up, and the page comes back here.

let waiting = null;

function viewLost(why) {
  hangUp();
  say(why);
  waitForResume();
}

function hangUp() {
  const { pc, socket } = view;
  view.pc = view.socket = null;
  view.transport = view.viewerId = view.controller = null;
  view.send = () => {};
  if (pc) pc.close();
  if (socket) socket.close(1000, "the view is opened again");
}

function waitForResume() {
  if (waiting) return;
  const check = async () => {
    try {
      await api("GET", `${base}/live`);
    } catch (error) {
      if (error.code !== "desktop_paused") { stopWaiting(); say(error.message); return; }
      say("the desktop is paused: the view comes back when it is resumed");
      $("resume").hidden = isShareLink;
      return;
    }
    stopWaiting();
    say("");
    start().then(refresh);
  };
  waiting = setInterval(check, 1000);
  check();
}

function stopWaiting() {
  clearInterval(waiting);
  waiting = null;
  $("resume").hidden = true;
}

$("resume").onclick = async () => {
  try {
    await api("POST", `${base}/resume`);
  } catch (error) {
    say(error.message);
  }
};

// --- control -----------------------------------------------------------------------------

function onMessage(message) {
  if (message.type === "control") {
    view.viewerId = message.viewer_id;
    view.controller = message.controller;
    view.canControl = message.can_control;
    showControl();
  } else if (message.type === "overlay") {
    overlay.show(message);
  } else if (message.type === "error") {
    say(message.detail);
  }
}

function controlling() { return view.viewerId !== null && view.controller === view.viewerId; }

function showControl() {
  const mine = controlling();
  $("take").hidden = !view.canControl || mine;
  $("release").hidden = !mine;
  $("record-start").hidden = !view.canControl || $("record-stop").hidden === false;
  stage.classList.toggle("controlling", mine);
  $("control-state").textContent = mine
    ? "You are in control"
    : view.controller ? "Someone else is in control" : view.canControl ? "View only" : "View-only link";
}

async function setControl(take) {
  try {
    onMessage(await api("POST", `${base}/control`, { viewer_id: view.viewerId, take }));
    if (take) surface().focus();
  } catch (error) {
    say(error.message);
  }
}
$("take").onclick = () => setControl(true);
$("release").onclick = () => { view.send({ type: "release" }); setControl(false); };

// --- input -------------------------------------------------------------------------------

function surface() { return view.transport === "MJPEG" ? img : video; }

// Where a pointer event falls on the desktop's screen: the picture is letterboxed inside
// its element (object-fit: contain), so scale by the smaller ratio and remove the bars.
function toScreen(event) {
  const box = surface().getBoundingClientRect();
  const { width, height } = view.screen;
  const scale = Math.min(box.width / width, box.height / height);
  const left = box.left + (box.width - width * scale) / 2;
  const top = box.top + (box.height - height * scale) / 2;
  const x = Math.floor((event.clientX - left) / scale);
  const y = Math.floor((event.clientY - top) / scale);
  return {
    x: Math.min(Math.max(x, 0), width - 1),
    y: Math.min(Math.max(y, 0), height - 1),
  };
}

const BUTTONS = { 0: "left", 1: "middle", 2: "right" };
let pendingMove = null;
let wheel = { x: 0, y: 0 };

function flushMove() {
  if (pendingMove) { view.send({ type: "move", ...pendingMove }); pendingMove = null; }
}

for (const element of [video, img]) {
  element.addEventListener("pointermove", (event) => {
    if (!controlling()) return;
    if (!pendingMove) requestAnimationFrame(flushMove);
    pendingMove = toScreen(event);
  });
  element.addEventListener("pointerdown", (event) => {
    if (!controlling() || !(event.button in BUTTONS)) return;
    event.preventDefault();
    element.focus();
    element.setPointerCapture(event.pointerId);
    pendingMove = null;
    view.send({ type: "button", ...toScreen(event), button: BUTTONS[event.button], down: true });
  });
  element.addEventListener("pointerup", (event) => {
    if (!controlling() || !(event.button in BUTTONS)) return;
    event.preventDefault();
    flushMove();
    view.send({ type: "button", ...toScreen(event), button: BUTTONS[event.button], down: false });
  });
  element.addEventListener("contextmenu", (event) => { if (controlling()) event.preventDefault(); });
  element.addEventListener("wheel", (event) => {
    if (!controlling()) return;
    event.preventDefault();
    // One wheel click is about 100 pixels, or 3 lines; keep the remainder for next time.
    const unit = event.deltaMode === 1 ? 1 / 3 : event.deltaMode === 2 ? 1 : 1 / 100;
    wheel.x += event.deltaX * unit;
    wheel.y += event.deltaY * unit;
    const dx = Math.trunc(wheel.x), dy = Math.trunc(wheel.y);
    wheel.x -= dx; wheel.y -= dy;
    const clamp = (n) => Math.max(-100, Math.min(100, n));
    if (dx || dy) view.send({ type: "wheel", ...toScreen(event), dx: clamp(dx), dy: clamp(dy) });
  }, { passive: false });
  element.addEventListener("keydown", (event) => sendKey(event, true));
  element.addEventListener("keyup", (event) => sendKey(event, false));
  element.addEventListener("compositionend", (event) => { if (controlling() && event.data) view.send({ type: "text", text: event.data }); });
  element.addEventListener("paste", (event) => {
    const text = event.clipboardData?.getData("text/plain");
    if (controlling() && text) { event.preventDefault(); view.send({ type: "text", text }); }
  });
  element.addEventListener("blur", () => { if (controlling()) view.send({ type: "release" }); });
}

function sendKey(event, down) {
  if (!controlling() || event.isComposing) return;
  // Let the page's own paste shortcut through; the paste event types the text.
  const paste = (event.ctrlKey || event.metaKey) && event.key.toLowerCase() === "v" && event.shiftKey;
  if (!paste) event.preventDefault();
  view.send({
    type: "key",
    down,
    key: event.key,
    code: event.code,
    shift: event.shiftKey,
    ctrl: event.ctrlKey,
    alt: event.altKey,
    meta: event.metaKey,
    altgr: event.getModifierState("AltGraph"),
  });
}

// --- recordings and sharing --------------------------------------------------------------

$("record-start").onclick = async () => {
  try { await api("POST", `${base}/recording/start`); await refresh(); } catch (error) { say(error.message); }
};
$("record-stop").onclick = async () => {
  $("record-stop").disabled = true;
  try { await api("POST", `${base}/recording/stop`); } catch (error) { say(error.message); }
  $("record-stop").disabled = false;
  await refresh();
};

function showRecordings(recordings, running) {
  $("record-stop").hidden = !running;
  $("record-start").hidden = Boolean(running) || !view.canControl;
  const list = $("recordings");
  list.replaceChildren(...recordings.slice().reverse().map((rec) => {
    const item = document.createElement("li");
    item.dataset.id = rec.id;
    const when = new Date(rec.started_at).toLocaleTimeString();
    if (rec.status === "recording") {
      item.textContent = `${when} · recording…`;
    } else if (rec.status === "failed") {
      item.textContent = `${when} · failed: ${rec.reason}`;
    } else {
      const seconds = (rec.duration_ms / 1000).toFixed(1);
      item.append(`${when} · ${seconds} s · `);
      const mp4 = Object.assign(document.createElement("a"), {
        href: `${base}/recordings/${rec.id}.mp4`, textContent: "MP4", className: "download",
      });
      mp4.setAttribute("download", "");
      const log = Object.assign(document.createElement("a"), {
        href: `${base}/recordings/${rec.id}/actions`, textContent: "actions", className: "actions",
      });
      item.append(mp4, " · ", log);
    }
    return item;
  }));
}

async function refresh() {
  if (waiting) return;
  try {
    const [live, recordings] = await Promise.all([
      api("GET", `${base}/live`), api("GET", `${base}/recordings`),
    ]);
    showRecordings(recordings, live.recording);
    showControl();
    $("resume").hidden = true;
  } catch (error) {
    if (error.code !== "desktop_paused") return say(error.message);
    say("the desktop is paused: its screen stands still until it is resumed");
    $("resume").hidden = isShareLink;
  }
}

async function share(mode) {
  try {
    const link = await api("POST", `${base}/share`, { mode });
    const field = $("share-url");
    field.value = link.url;
    field.hidden = false;
    field.dataset.mode = mode;
    field.select();
  } catch (error) {
    say(error.message);
  }
}
$("share").hidden = isShareLink;
$("share-view").onclick = () => share("view");
$("share-control").onclick = () => share("control");

// --- figures -----------------------------------------------------------------------------

async function showStats() {
  if (view.transport !== "WebRTC" || !view.pc) { $("stats").textContent = ""; return; }
  const report = await view.pc.getStats();
  report.forEach((entry) => {
    if (entry.type === "inbound-rtp" && entry.kind === "video") {
      const fps = entry.framesPerSecond ?? 0;
      $("stats").textContent = `${video.videoWidth}×${video.videoHeight} · ${fps} fps · ${entry.framesDecoded} frames`;
    }
  });
}

// A page that goes away hangs up at once: without that, the service streams on to it
// until ICE consent fails, about 30 s later. A page brought back from the back/forward
// cache has nothing to show, so it starts over.
window.addEventListener("pagehide", () => {
  if (view.pc) view.pc.close();
  if (view.socket) view.socket.close(1000, "the page was left");
});
window.addEventListener("pageshow", (event) => { if (event.persisted) location.reload(); });

start().then(refresh);
// --- usage: the desktop's CPU and memory, as the service reads them every few seconds ----

const USAGE_WINDOW_MS = 10 * 60 * 1000;

function mebibytes(bytes) { return `${Math.round(bytes / 2 ** 20)} MiB`; }

function drawUsage(canvas, samples, memoryLimit) {
  const context = canvas.getContext("2d");
  const { width, height } = canvas;
  context.clearRect(0, 0, width, height);
  const now = Date.now();
  // The last ten minutes, or since the first reading (a minute at least)
  const first = samples.length ? Date.parse(samples[0].at) : now;
  const span = Math.max(60_000, Math.min(USAGE_WINDOW_MS, now - first));
  const x = (sample) => width - ((now - Date.parse(sample.at)) / span) * width;
  const line = (color, value) => {
    context.strokeStyle = color;
    context.lineWidth = 1.5;
    context.beginPath();
    samples.forEach((sample, index) => {
      const y = height - 2 - Math.min(1, value(sample)) * (height - 4);
      if (index === 0) context.moveTo(x(sample), y); else context.lineTo(x(sample), y);
    });
    context.stroke();
  };
  const cpuTop = Math.max(100, ...samples.map((s) => s.cpu_pct || 0));
  line("#1e78eb", (s) => (s.cpu_pct || 0) / cpuTop);
  line("#e08a00", (s) => s.memory_bytes / memoryLimit);
}

async function showUsage() {
  if (isShareLink) return;  // the desktop's figures are its owner's
  const since = new Date(Date.now() - USAGE_WINDOW_MS).toISOString();
  let metrics;
  try {
    metrics = await api("GET", `${base}/metrics?start=${encodeURIComponent(since)}`);
  } catch {
    $("usage").hidden = true;  // a share link may not read it; a desktop gone has none
    return;
  }
  $("usage").hidden = false;
  const samples = metrics.samples;
  const chart = $("usage-chart");
  chart.dataset.samples = String(samples.length);
  const last = samples[samples.length - 1];
  $("usage-now").textContent = last
    ? `CPU ${Math.round(last.cpu_pct || 0)} % · memory ${mebibytes(last.memory_bytes)} of ${mebibytes(metrics.memory_limit_bytes)}`
    : `no reading yet (one every ${metrics.interval_s} s)`;
  drawUsage(chart, samples, metrics.memory_limit_bytes);
}

setInterval(refresh, 2000);
setInterval(showStats, 1000);
showUsage();
setInterval(showUsage, 5000);
