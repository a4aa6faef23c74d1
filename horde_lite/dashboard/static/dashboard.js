// Live refresh: every few seconds, re-fetch each panel's HTML fragment from
// /dashboard/panels/<name> and swap it in (not while a form in it is being filled in). A lost
// session (401/403) reloads the page, which then shows the sign-in form. No framework, no build step.
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

  // A panel holding a form being filled in (focused, or typed into) is left as it is this round.
  function editing(panel) {
    if (panel.contains(document.activeElement) && document.activeElement !== document.body) return true;
    return Array.from(panel.querySelectorAll("input")).some(
      (input) => input.type !== "hidden" && input.type !== "checkbox" && input.value !== input.defaultValue
    );
  }

  async function refresh(panel) {
    const name = panel.dataset.panel;
    if (editing(panel)) return true;
    // The page's search (?q=) applies to the panels that have a search box.
    const search = new URLSearchParams(window.location.search).get("q");
    const query = search ? "?q=" + encodeURIComponent(search) : "";
    const response = await fetch("/dashboard/panels/" + encodeURIComponent(name) + query, {
      credentials: "same-origin",
      cache: "no-store",
      headers: { Accept: "text/html" },
    });
    if (response.status === 401 || response.status === 403) {
      window.location.reload();
      return false;
    }
    if (!response.ok) throw new Error(name + ": HTTP " + response.status);
    const html = await response.text();
    if (editing(panel)) return true; // a form was started while the fragment was on its way
    panel.querySelector(".body").innerHTML = html;
    panel.dataset.updated = String(Date.now());
    panel.classList.add("updated");
    return true;
  }

  async function round() {
    const panels = Array.from(document.querySelectorAll("[data-panel]"));
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
