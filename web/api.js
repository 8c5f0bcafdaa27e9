// What the pages share: a fetch wrapper that turns an error answer into an Error with the
// service's own words. No page holds the token: the service swapped the `?token=` of the
// link that opened it for an HttpOnly cookie, and this drops it from the address (history,
// bookmarks, Referer); every request carries the cookie from then on.
"use strict";

const cubicle = (() => {
  const params = new URLSearchParams(location.search);
  const given = params.get("token");
  if (given !== null) {
    // A share link opens one desktop's live view only: the page hides what it cannot do.
    sessionStorage.setItem("cubicle-share-link", given.startsWith("share") ? "1" : "");
    params.delete("token");
    const query = params.toString();
    history.replaceState(history.state, "", location.pathname + (query ? `?${query}` : "") + location.hash);
  }
  const isShareLink = sessionStorage.getItem("cubicle-share-link") === "1";
  // The service set the cookie with the page already; this says so, or why not.
  const ready = given === null ? Promise.resolve(null) : fetch("/api/session", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ token: given }),
  }).then(async (response) => response.ok ? null : (await response.json()).detail);

  // Without a cookie (a page opened without a token, or a cookie that expired): ask once.
  async function signIn() {
    const token = prompt("Access token");
    if (!token) return false;
    const response = await fetch("/api/session", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ token }),
    });
    return response.ok;
  }

  async function api(method, path, body, retried = false) {
    const refused = await ready;
    if (refused) throw new Error(refused);
    const response = await fetch(path, {
      method,
      headers: body ? { "Content-Type": "application/json" } : {},
      body: body ? JSON.stringify(body) : undefined,
    });
    if (response.status === 401 && !retried && !isShareLink && (await signIn())) {
      return api(method, path, body, true);
    }
    if (!response.ok) {
      const problem = await response.json().catch(() => ({ detail: response.statusText }));
      throw Object.assign(new Error(problem.detail), { status: response.status, code: problem.error });
    }
    return response.status === 204 ? null : response.json();
  }

  return { params, isShareLink, api };
})();
