// The desktop list: a screenshot of each desktop, refreshed about once a second.
// Requests carry the page's cookie (see api.js): no URL holds the token.
const { api } = cubicle;
const statusLine = document.getElementById("status");

const cards = new Map();

function card(info) {
  let node = cards.get(info.id);
  if (!node) {
    node = document.getElementById("card").content.firstElementChild.cloneNode(true);
    node.querySelector(".id").textContent = info.id;
    node.querySelector(".kill").onclick = () => api("DELETE", `/api/desktops/${info.id}`).then(refresh);
    const viewer = `/view/${info.id}`;
    node.querySelector(".watch").href = viewer;
    node.querySelector(".open").href = viewer;
    document.getElementById("desktops").append(node);
    cards.set(info.id, node);
  }
  const state = node.querySelector(".state");
  state.textContent = info.reason ? `${info.status}: ${info.reason}` : info.status;
  state.className = `state ${info.status}`;
  node.querySelector(".watch").hidden = info.status !== "ready";
  if (info.status === "ready") {
    const shot = `/api/desktops/${info.id}/screenshot?format=jpeg&max_width=640`;
    const img = node.querySelector("img");
    const next = new Image();
    next.onload = () => { img.src = next.src; };
    next.src = `${shot}&t=${Date.now()}`;
  }
}

async function refresh() {
  try {
    const desktops = await api("GET", "/api/desktops");
    const seen = new Set(desktops.map((d) => d.id));
    for (const [id, node] of cards) if (!seen.has(id)) { node.remove(); cards.delete(id); }
    desktops.forEach(card);
    statusLine.textContent = `${desktops.length} desktop(s)`;
  } catch (error) {
    statusLine.textContent = error.message;
  }
}

document.getElementById("create").onclick = async (event) => {
  event.target.disabled = true;
  statusLine.textContent = "starting a desktop…";
  try {
    await api("POST", "/api/desktops", {});
  } catch (error) {
    statusLine.textContent = error.message;
  }
  event.target.disabled = false;
  refresh();
};

refresh();
setInterval(refresh, 1000);
