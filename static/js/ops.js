// The operations page refreshes itself: every few seconds it fetches /ops/status.json and
// swaps in the panels the server rendered from the same snapshot as the first page load.
// When the feed fails, the last panels stay and the header says they are stale.
(() => {
  "use strict";
  const panels = document.getElementById("ops-panels");
  const live = document.getElementById("ops-live");
  const updated = document.getElementById("ops-updated");
  if (!panels) return;
  const feed = panels.dataset.feed;
  const interval = Number(panels.dataset.interval) || 5000;
  let refreshes = 0;

  const show = (state, text) => {
    live.dataset.state = state;
    live.textContent = text;
  };

  async function refresh() {
    const response = await fetch(feed, {
      headers: { Accept: "application/json" },
      credentials: "same-origin",
      cache: "no-store",
    });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const data = await response.json();
    panels.innerHTML = data.html;  // server-rendered, escaped by Django's templates
    const at = new Date(data.generated_at);
    updated.dateTime = data.generated_at;
    updated.textContent = at.toLocaleTimeString([], { hour12: false });
    refreshes += 1;
    panels.dataset.refreshes = String(refreshes);
    show("live", `live, every ${interval / 1000} s`);
  }

  async function loop() {
    if (!document.hidden) {
      try {
        await refresh();
      } catch (error) {
        show("stale", `feed unreachable (${error.message}); showing the last data`);
      }
    }
    setTimeout(loop, interval);
  }

  show("live", `live, every ${interval / 1000} s`);
  setTimeout(loop, interval);
})();
