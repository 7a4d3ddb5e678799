// nvpair-tw live status page: a snapshot from /api/state, then every bus event from /events.
// Only metadata is ever shown (events carry no prompts); all text goes in through textContent.
"use strict";
(() => {
  const MAX_FAILOVERS = 20;
  const state = { offset: 0, runId: null, facades: [], workloads: new Map(), failovers: [] };

  const now = () => Date.now() + state.offset;

  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  }

  function row(cells) {
    const tr = document.createElement("tr");
    for (const cell of cells) tr.appendChild(cell instanceof Node ? cell : el("td", cell));
    return tr;
  }

  function ago(ms) {
    if (ms === null || ms === undefined) return "never";
    const s = Math.max(0, (now() - ms) / 1000);
    if (s < 60) return s.toFixed(0) + " s ago";
    if (s < 3600) return (s / 60).toFixed(0) + " min ago";
    return (s / 3600).toFixed(1) + " h ago";
  }

  function seconds(ms) {
    return (Math.max(0, ms) / 1000).toFixed(1) + " s";
  }

  function findNode(engine, id) {
    const facade = state.facades.find((f) => f.engine === engine);
    return facade ? facade.nodes.find((n) => n.id === id) : undefined;
  }

  function render() {
    document.getElementById("run-id").textContent = state.runId || "…";
    const inflight = new Map();
    for (const w of state.workloads.values()) {
      const key = w.engine + "/" + w.scheduledOn;
      inflight.set(key, (inflight.get(key) || 0) + 1);
    }
    const root = document.getElementById("facades");
    root.replaceChildren();
    for (const facade of state.facades) {
      const title = el("h2", facade.engine + " facade ");
      title.appendChild(el("span", facade.listening ? "listening" : "not listening",
        facade.listening ? "ready" : "bad"));
      if (facade.pin) title.appendChild(el("span", " · pinned to " + facade.pin, "muted"));
      title.appendChild(el("span", " · queue: ", "muted"));
      title.appendChild(el("span", facade.queueDepth || 0, "queue-depth"));
      root.appendChild(title);
      const table = el("table");
      table.dataset.engine = facade.engine;
      const head = el("thead");
      head.appendChild(row(["node", "kind", "url", "inventory", "loaded", "slots", "busy waits",
        "in flight", "reservations", "state", "last success"].map((t) => el("th", t))));
      table.appendChild(head);
      const body = el("tbody");
      for (const node of facade.nodes) {
        const models = node.inventoryKnown
          ? node.models.length + " model(s): " + node.models.join(", ") +
            (node.inventoryAt ? " (polled " + ago(node.inventoryAt) + ")" : " (static)")
          : "unknown";
        let cooldown;
        if (node.cordon) {
          cooldown = el("td", "cordoned — " + node.cordon.reason, "cooldown cordoned");
        } else if (node.cooling) {
          const left = node.cooling.until - now();
          cooldown = el("td", "cooling, " + (left > 0 ? seconds(left) + " left" : "ending") +
            " — " + node.cooling.reason, "cooldown cooling");
        } else {
          cooldown = el("td", "ready", "cooldown ready");
        }
        const loaded = Array.isArray(node.loaded)
          ? (node.loaded.length ? node.loaded.join(", ") : "none")
          : "unknown";
        const slots = (node.slotsInUse || 0) + " / " + (node.slots ? node.slots : "∞ unlimited");
        const tr = row([el("td", node.id), el("td", node.kind || "", "kind"),
          el("td", node.url, "muted"),
          el("td", models, node.inventoryKnown ? "" : "bad"),
          el("td", loaded, Array.isArray(node.loaded) ? "loaded" : "loaded muted"),
          el("td", slots, "slots"), el("td", node.busyWaits || 0, "busy-waits"),
          el("td", inflight.get(facade.engine + "/" + node.id) || 0, "inflight"),
          el("td", node.reservations), cooldown, el("td", ago(node.lastSuccess), "last-success")]);
        tr.dataset.node = facade.engine + "/" + node.id;
        body.appendChild(tr);
      }
      table.appendChild(body);
      root.appendChild(table);
    }
    const workloads = document.getElementById("workloads");
    workloads.replaceChildren();
    for (const w of state.workloads.values()) {
      workloads.appendChild(row([w.id, w.engine, w.model, w.scheduledOn || "—",
        w.startedAt ? seconds(now() - w.startedAt) : "—"]));
    }
    const failovers = document.getElementById("failovers");
    failovers.replaceChildren();
    for (const f of state.failovers) {
      const path = (f.attempts || []).map((a) => a.node_id + " " + a.outcome + " (" + a.ms + " ms)");
      failovers.appendChild(row([ago(f.at), f.id, f.engine, f.path, path.join(" → "),
        f.node_id || "—", f.status]));
    }
  }

  async function load() {
    try {
      const response = await fetch("api/state", { cache: "no-store" });
      const snapshot = await response.json();
      state.offset = snapshot.now - Date.now();
      state.runId = snapshot.runId;
      state.facades = snapshot.facades;
      state.workloads = new Map(snapshot.workloads.map((w) => [w.id, w]));
      state.failovers = snapshot.failovers;
      const store = document.getElementById("store");
      store.hidden = !snapshot.store;
      if (snapshot.store) {
        store.textContent = "fleet store " + snapshot.store.store + ": " + snapshot.store.state +
          (snapshot.store.state === "down" ? " (working on local state)" : "");
      }
      render();
    } catch (error) {
      document.getElementById("connection").textContent = "snapshot failed, retrying";
    }
  }

  // Slots, queue depth and busy waits have no events of their own: a workload or request event
  // (which is when they change) refreshes the snapshot, at most once per REFRESH_MS.
  const REFRESH_MS = 250;
  let refresh = null;
  function refreshSoon() {
    if (refresh === null) {
      refresh = setTimeout(() => {
        refresh = null;
        load();
      }, REFRESH_MS);
    }
  }

  const handlers = {
    "workload:queued": (p) => state.workloads.set(p.workload.id, p.workload),
    "workload:started": (p) => state.workloads.set(p.workload.id, p.workload),
    "workload:completed": (p) => state.workloads.delete(p.workload.id),
    "workload:errored": (p) => state.workloads.delete(p.workload.id),
    "node/cooldown": (p) => {
      const node = findNode(p.engine, p.node_id);
      if (node) node.cooling = { until: p.coolingUntil, reason: p.reason };
    },
    "node/cooldown-ended": (p) => {
      const node = findNode(p.engine, p.node_id);
      if (node) node.cooling = null;
    },
    "node/cordon": (p) => {
      const node = findNode(p.engine, p.node_id);
      if (node) node.cordon = { reason: p.reason, since: p.since, origin: p.origin };
    },
    "node/uncordon": (p) => {
      const node = findNode(p.engine, p.node_id);
      if (node) node.cordon = null;
    },
    "proxy/request": (p) => {
      const node = p.node_id ? findNode(p.engine, p.node_id) : undefined;
      if (node && p.status >= 200 && p.status < 300) node.lastSuccess = now();
      if ((p.attempts || []).length > 1 && !state.failovers.some((f) => f.id === p.id)) {
        state.failovers.unshift({ at: now(), id: p.id, engine: p.engine, path: p.path,
          node_id: p.node_id, status: p.status, attempts: p.attempts });
        state.failovers.length = Math.min(state.failovers.length, MAX_FAILOVERS);
      }
    },
  };

  const events = new EventSource("events");
  const connection = document.getElementById("connection");
  events.onopen = () => {
    connection.textContent = "live";
    connection.className = "ready";
    load();
  };
  events.onerror = () => {
    connection.textContent = "reconnecting…";
    connection.className = "bad";
  };
  for (const [name, handle] of Object.entries(handlers)) {
    events.addEventListener(name, (message) => {
      handle(JSON.parse(message.data));
      render();
      if (name.startsWith("workload:") || name === "proxy/request") refreshSoon();
    });
  }
  setInterval(render, 500);
  setInterval(load, 10000);
})();
