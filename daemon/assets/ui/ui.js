// tinkerbox web UI: the live parts. The pages are whole without it; with
// it, an EventSource on /ui/stream brings the stored events as they land
// (at most four messages a second, the newest 100 events of each):
// the machines list re-fetches the rows of the machines an event names
// (at most once per half second each), a machine's page prepends the
// event to its timeline and re-fetches its host, Workflow and BMC jobs
// panels (a BareMetalHost's page its own);
// the dashboard prepends every event to its own.
"use strict";
(function () {
  // A button that asks first (power, netboot): the form posts only once
  // confirmed. Without the script the buttons post at once.
  document.addEventListener("click", (e) => {
    const b = e.target.closest("button[data-confirm]");
    if (b && !window.confirm(b.dataset.confirm)) e.preventDefault();
  });

  // "/" goes to the search box (as on most consoles), unless typing.
  document.addEventListener("keydown", (e) => {
    if (e.key !== "/" || e.ctrlKey || e.metaKey || e.altKey) return;
    if (e.target.closest("input, textarea, select, [contenteditable]")) return;
    const q = document.querySelector("input[name=q]");
    if (!q) return;
    e.preventDefault();
    q.focus();
    q.select();
  });

  const live = document.getElementById("live");
  const list = document.getElementById("machines");
  // A machine's page, or a BareMetalHost's: its panels re-fetched from
  // their data-src as its events land.
  const page = document.querySelector(".machine[data-machine]");
  const panels = document.getElementById("panels");
  const timeline = document.getElementById("timeline");
  // The list follows every machine; a timeline (a machine's, or the
  // dashboard's) or a host's panels the stream it names, resumed after its
  // newest event.
  // The list's stream carries only the machines it shows.
  const url = list
    ? "/ui/stream?machines=" + encodeURIComponent(
        [...list.querySelectorAll("tr[data-machine]")].map((r) => r.dataset.machine).join(","))
    : (timeline && timeline.dataset.stream) || (panels && panels.dataset.stream);
  if (!url) return;
  const source = new EventSource(url);
  source.onopen = () => live && live.classList.add("on");
  source.onerror = () => live && live.classList.remove("on");

  // Coalesced fetches: a key is fetched once per window, however many
  // events name it.
  const due = new Map();
  function soon(key, fetcher) {
    if (due.has(key)) return;
    due.set(key, setTimeout(() => { due.delete(key); fetcher(); }, 500));
  }

  async function fragment(path) {
    const r = await fetch(path, { credentials: "same-origin" });
    if (!r.ok) return null;
    const t = document.createElement("template");
    t.innerHTML = (await r.text()).trim();
    return t.content;
  }

  function refreshRow(key) {
    const row = list.querySelector('tr[data-machine="' + CSS.escape(key) + '"]');
    if (!row) return;
    soon(key, async () => {
      const f = await fragment("/ui/machines/" + key + "/row");
      const fresh = f && f.querySelector("tr");
      if (!fresh) return;
      fresh.classList.add("flash");
      row.replaceWith(fresh);
    });
  }

  // A form being filled in (the claim's) is never replaced under the
  // person typing: its panel waits for the next event after.
  function editing(el) {
    return [...el.querySelectorAll("input:not([type=hidden]), textarea, select")].some((i) =>
      i === document.activeElement ||
      (i.tagName === "SELECT"
        ? i.selectedIndex !== Math.max(0, [...i.options].findIndex((o) => o.defaultSelected))
        : i.value !== i.defaultValue));
  }

  function prepend(e) {
    const ol = timeline;
    if (!ol || ol.querySelector('li[data-id="' + e.id + '"]')) return;
    const li = document.createElement("li");
    li.dataset.id = e.id;
    li.className = "new";
    const time = document.createElement("time");
    time.textContent = e.time;
    const kind = document.createElement("span");
    kind.className = "kind";
    kind.textContent = e.kind;
    const who = ol.dataset.who && e.name ? e.namespace + "/" + e.name + ": " : "";
    li.append(time, " ", kind, " ", who + e.message);
    ol.prepend(li);
    while (ol.children.length > 500) ol.lastElementChild.remove();
  }

  source.onmessage = (m) => {
    let rows;
    try { rows = JSON.parse(m.data); } catch (_) { return; }
    for (const e of rows) {
      if (timeline && !page) prepend(e);
      if (!e.name) continue;
      const key = e.namespace + "/" + e.name;
      if (list) refreshRow(key);
      if (page && key === page.dataset.machine) {
        prepend(e);
        if (panels) soon("panels", async () => {
          if (editing(panels)) return;
          const f = await fragment(panels.dataset.src);
          if (f && !editing(panels)) panels.replaceChildren(f);
        });
      }
    }
  };
})();
