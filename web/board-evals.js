// The board's "Run suite": start an evaluation run of a suite the service has; its tasks
// appear on the board, tagged with the run, and the report page follows the score.
"use strict";

(() => {
  const { api } = cubicle;
  const $ = (id) => document.getElementById(id);
  $("evals-link").href = "/web/evals.html";

  async function load() {
    const [suites, profiles] = await Promise.all([api("GET", "/api/evals/suites"), api("GET", "/api/board/profiles")]);
    $("suite").replaceChildren(...suites.map((s) => new Option(
      s.problem ? `${s.name} (${s.problem})` : `${s.name}: ${s.tasks} tasks (${s.domains.join(", ")})`, s.name)));
    $("suite-profile").replaceChildren(...profiles.map((p) => new Option(p.ready ? p.name : `${p.name} (not ready)`, p.name)));
  }

  $("run-suite").addEventListener("toggle", () => { if ($("run-suite").open) load().catch((e) => { $("suite-status").textContent = e.message; }); });

  $("suite-form").onsubmit = async (event) => {
    event.preventDefault();
    const form = event.target;
    const body = { suite: form.elements.suite.value, profile: form.elements.profile.value || "default" };
    body.attempts = Number(form.elements.attempts.value) || 1;
    if (form.elements.concurrency.value) body.concurrency = Number(form.elements.concurrency.value);
    $("suite-status").textContent = "starting…";
    try {
      const run = await api("POST", "/api/evals", body);
      const link = document.createElement("a");
      link.href = `/web/evals.html?run=${run.id}`;
      link.textContent = `report of ${run.name}`;
      $("suite-status").replaceChildren(`Run ${run.id} started: ${run.tasks} tasks × ${run.attempts}. `, link);
    } catch (error) {
      $("suite-status").textContent = error.message;
    }
  };
})();
