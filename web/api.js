// What the pages share: the token (from the URL the service printed, kept for the tab) and
// a fetch wrapper that turns an error answer into an Error with the service's own words.
"use strict";

const cubicle = (() => {
  const params = new URLSearchParams(location.search);
  const token = params.get("token") || sessionStorage.getItem("cubicle-token") || prompt("Access token");
  // A share link opens one desktop's live view only: it must not become the tab's token.
  const isShareLink = token.startsWith("share1.");
  if (!isShareLink) sessionStorage.setItem("cubicle-token", token);
  const auth = { Authorization: `Bearer ${token}` };

  async function api(method, path, body) {
    const response = await fetch(path, {
      method,
      headers: body ? { ...auth, "Content-Type": "application/json" } : auth,
      body: body ? JSON.stringify(body) : undefined,
    });
    if (!response.ok) {
      const problem = await response.json().catch(() => ({ detail: response.statusText }));
      throw new Error(problem.detail);
    }
    return response.status === 204 ? null : response.json();
  }

  // A path with the token in its query, for links, images, videos and event streams.
  const withToken = (path) => `${path}${path.includes("?") ? "&" : "?"}token=${encodeURIComponent(token)}`;

  return { params, token, isShareLink, api, withToken };
})();
