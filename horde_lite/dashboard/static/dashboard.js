// Live refresh: every few seconds, re-fetch each panel's HTML fragment from
// /dashboard/panels/<name> and swap it in (not the panels marked data-static, which hold forms).
// A lost session (401/403) reloads the page, which then shows the sign-in form. No framework, no
// build step.
(function () {
  "use strict";
  const grid = document.querySelector("main.grid");
  if (!grid) return;
  const seconds = Math.max(1, Number(grid.dataset.refresh) || 5);
  const state = document.getElementById("refresh-state");
  let rounds = 0;

  function mark(text, cls) {
    if (!state) return;
    state.textContent = text;
    state.className = "state " + cls;
  }

  async function refresh(panel) {
    const name = panel.dataset.panel;
    const response = await fetch("/dashboard/panels/" + encodeURIComponent(name), {
      credentials: "same-origin",
      cache: "no-store",
      headers: { Accept: "text/html" },
    });
    if (response.status === 401 || response.status === 403) {
      window.location.reload();
      return false;
    }
    if (!response.ok) throw new Error(name + ": HTTP " + response.status);
    panel.querySelector(".body").innerHTML = await response.text();
    panel.dataset.updated = String(Date.now());
    panel.classList.add("updated");
    return true;
  }

  async function round() {
    const panels = Array.from(document.querySelectorAll("[data-panel]:not([data-static])"));
    try {
      await Promise.all(panels.map(refresh));
      rounds += 1;
      grid.dataset.rounds = String(rounds);
      mark("(live, updated " + new Date().toLocaleTimeString() + ")", "live");
    } catch (error) {
      mark("(refresh failed: " + error.message + "; retrying)", "stale");
    }
    window.setTimeout(round, seconds * 1000);
  }

  round();
})();
