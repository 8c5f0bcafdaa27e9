// The action overlay: what the agent or a person does on the desktop, drawn over the live
// picture as it happens. The service sends one message per batch of actions
// ({type: "overlay", source: "api" | "viewer", marks: [...]}, see cubicle/server/live/overlay.py):
// a click is a ripple at its point, a drag its path, a scroll a chevron, typed text and keys
// a caption. The agent's marks are magenta, a person's blue. The SVG has the screen's size
// as its viewBox and the picture's letterboxing (xMidYMid meet = object-fit: contain), so
// marks sit on the screen pixels they name. The toggle hides it all (remembered per browser).
"use strict";

const overlay = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const WHO = { api: "Agent", viewer: "Person" };
  const SHOWN_MS = { click: 1000, drag: 1600, scroll: 1100, caption: 2600 };
  const svg = document.getElementById("overlay");
  const captions = document.getElementById("captions");
  const toggle = document.getElementById("overlay-toggle");
  let on = localStorage.getItem("cubicle-overlay") !== "off";

  function node(name, attributes, parent) {
    const made = document.createElementNS(NS, name);
    for (const [key, value] of Object.entries(attributes)) made.setAttribute(key, value);
    if (parent) parent.append(made);
    return made;
  }

  function later(element, ms) { setTimeout(() => element.remove(), ms); }

  function label(parent, x, y, text) {
    node("text", { x, y, class: "label" }, parent).textContent = text;
  }

  function ripple(mark, who, source) {
    const group = node("g", {
      class: `mark ripple ${who}`, "data-x": mark.x, "data-y": mark.y,
      "data-button": mark.button, "data-count": mark.count, transform: `translate(${mark.x} ${mark.y})`,
    }, svg);
    for (let ring = 0; ring < mark.count; ring++) {
      node("circle", { class: "ring", r: 10, style: `animation-delay: ${ring * 120}ms` }, group);
    }
    node("circle", { class: "dot", r: 5 }, group);
    const extra = [mark.modifiers.join("+"), mark.button !== "left" ? mark.button : "",
      mark.count > 1 ? `×${mark.count}` : ""].filter(Boolean).join(" ");
    label(group, 14, 22, `${WHO[source]}${extra ? ` ${extra}` : ""}`);
    later(group, SHOWN_MS.click);
  }

  function trail(mark, who) {
    const group = node("g", { class: `mark trail ${who}` }, svg);
    node("polyline", { points: mark.points.map((p) => p.join(",")).join(" ") }, group);
    const [x0, y0] = mark.points[0], [x1, y1] = mark.points[mark.points.length - 1];
    node("circle", { class: "dot", cx: x0, cy: y0, r: 5 }, group);
    node("circle", { class: "end", cx: x1, cy: y1, r: 8 }, group);
    later(group, SHOWN_MS.drag);
  }

  function scroll(mark, who, source) {
    const group = node("g", {
      class: `mark scroll ${who}`, "data-x": mark.x, "data-y": mark.y, transform: `translate(${mark.x} ${mark.y})`,
    }, svg);
    const angle = mark.dy ? (mark.dy > 0 ? 0 : 180) : (mark.dx > 0 ? -90 : 90);
    const chevrons = node("g", { transform: `rotate(${angle})` }, group);
    for (const y of [-6, 4]) node("polyline", { points: `-9,${y} 0,${y + 9} 9,${y}` }, chevrons);
    label(group, 16, 22, `${WHO[source]} scroll ×${Math.abs(mark.dy || mark.dx)}`);
    later(group, SHOWN_MS.scroll);
  }

  function caption(mark, who, source) {
    const verb = mark.kind === "text" ? "typed" : "pressed";
    const last = captions.lastElementChild;
    if (mark.kind === "text" && last && last.dataset.kind === "text" && last.dataset.source === source) {
      last.dataset.text = (last.dataset.text + mark.text).slice(-80);
      last.querySelector(".what").textContent = last.dataset.text;
      clearTimeout(last.timer);
      last.timer = setTimeout(() => last.remove(), SHOWN_MS.caption);
      return;
    }
    const line = document.createElement("div");
    line.className = `caption ${who}`;
    Object.assign(line.dataset, { kind: mark.kind, source, text: mark.text });
    const what = Object.assign(document.createElement("span"), { className: "what", textContent: mark.text });
    line.append(`${WHO[source]} ${verb}: `, what);
    captions.append(line);
    while (captions.children.length > 3) captions.firstElementChild.remove();
    line.timer = setTimeout(() => line.remove(), SHOWN_MS.caption);
  }

  function show(message) {
    if (!on) return;
    const who = message.source === "api" ? "agent" : "person";
    for (const mark of message.marks) {
      if (mark.kind === "click") ripple(mark, who, message.source);
      else if (mark.kind === "drag") trail(mark, who);
      else if (mark.kind === "scroll") scroll(mark, who, message.source);
      else caption(mark, who, message.source);
    }
  }

  function setSize(width, height) { svg.setAttribute("viewBox", `0 0 ${width} ${height}`); }

  function setOn(value) {
    on = value;
    localStorage.setItem("cubicle-overlay", on ? "on" : "off");
    svg.style.display = captions.style.display = on ? "" : "none";
    if (!on) { svg.replaceChildren(); captions.replaceChildren(); }
    toggle.setAttribute("aria-pressed", String(on));
    toggle.textContent = on ? "Actions shown" : "Actions hidden";
  }
  toggle.onclick = () => setOn(!on);
  setOn(on);

  return { show, setSize, setOn, get on() { return on; } };
})();
