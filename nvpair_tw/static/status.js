// nvpair-tw live status page: a snapshot from /api/state, then every bus event from /events.
// A node's state, the request counts and the recent requests are the snapshot's (the status board
// computes them); phase and fan-out events update the requests in flight and the pulls at once,
// and every phase, fan-out, request, workload or node event re-reads the snapshot (at most every
// 250 ms). The
// throughput chart is drawn from the snapshot's `throughput`; the last 24 hours come from
// /api/usage. Only metadata is ever shown (events carry no prompts, usage only key names); all
// text goes in through textContent.
"use strict";
(() => {
  const MAX_FAILOVERS = 20;
  const MAX_ENDED_FAN_OUTS = 5;
  const state = { offset: 0, runId: null, version: null, facades: [], inFlight: new Map(),
    recent: [], byKey: [], byModel: [], fanOuts: [], failovers: [], throughput: null };

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

  function emptyRow(body, columns, text) {
    const cell = el("td", text, "muted");
    cell.colSpan = columns;
    body.appendChild(row([cell]));
  }

  function ago(ms) {
    if (ms === null || ms === undefined) return "never";
    const s = Math.max(0, (now() - ms) / 1000);
    if (s < 60) return s.toFixed(0) + " s ago";
    if (s < 3600) return (s / 60).toFixed(0) + " min ago";
    return (s / 3600).toFixed(1) + " h ago";
  }

  function clock(ms) {
    const at = new Date(ms - state.offset);
    return [at.getHours(), at.getMinutes(), at.getSeconds()]
      .map((n) => String(n).padStart(2, "0")).join(":");
  }

  function seconds(ms) {
    return (Math.max(0, ms) / 1000).toFixed(1) + " s";
  }

  function duration(ms) {
    if (ms === null || ms === undefined) return "—";
    return ms < 1000 ? ms + " ms" : seconds(ms);
  }

  function bytes(n) {
    const units = ["B", "kB", "MB", "GB", "TB"];
    let value = n;
    let unit = 0;
    while (value >= 1000 && unit < units.length - 1) {
      value /= 1000;
      unit += 1;
    }
    return (unit ? String(Number(value.toFixed(1))) : String(value)) + " " + units[unit];
  }

  // The queue per priority (docs/behaviour.md §16.3): how many wait, and the oldest wait.
  function queueByPriority(queue) {
    if (!queue) return "";
    const parts = ["interactive", "batch"].map((p) => {
      const q = queue[p] || { waiting: 0, oldestWaitMs: 0 };
      return p + " " + q.waiting + (q.waiting ? ", oldest " + seconds(q.oldestWaitMs) : "");
    });
    return " (" + parts.join(" · ") + ")";
  }

  // Each model's learnt rates on a node (docs/behaviour.md §15.1), as text.
  function measuredRates(rates) {
    const models = Object.keys(rates || {}).sort();
    if (!models.length) return "not measured";
    return models.map((m) => {
      const r = rates[m];
      return m + ": " + rate(r.decodeTokensPerSecond) + " tok/s decode, " +
        rate(r.prefillTokensPerSecond) + " tok/s prefill (" + r.samples + " samples)";
    }).join("; ");
  }

  // The context each model is served with on a node (docs/behaviour.md §15.3), as text.
  function contextsText(contexts) {
    const models = Object.keys(contexts || {}).sort();
    if (!models.length) return "not stated";
    return models.map((m) => m + ": " + contexts[m] + " tokens").join(", ");
  }

  // --- the addresses and the nodes -------------------------------------------------------------

  function renderAddresses() {
    const list = document.getElementById("addresses");
    list.replaceChildren();
    for (const facade of state.facades) {
      const item = el("li");
      item.dataset.engine = facade.engine;
      if (facade.address) {
        item.appendChild(el("span", facade.engine + ": "));
        item.appendChild(el("code", facade.address.url));
        item.appendChild(el("span", " · OpenAI-style clients: "));
        item.appendChild(el("code", facade.address.openai));
      } else {
        item.textContent = facade.engine + ": not listening yet";
      }
      list.appendChild(item);
    }
  }

  // A node's state (the board's, in precedence: unreachable, cooling, cordoned, busy, unknown,
  // ready) as one line of plain words.
  function stateText(s) {
    if (s.state === "ready") return "ready";
    if (s.state === "unreachable") {
      return "unreachable — " + s.why + " at " + s.url +
        (s.since ? ", since " + clock(s.since) + " (" + ago(s.since) + ")" : "");
    }
    if (s.state === "cooling") {
      const left = s.until - now();
      return "cooling, " + (left > 0 ? seconds(left) + " left" : "ending") + " — " + s.why;
    }
    return s.state + " — " + s.why;
  }

  function inventoryText(node) {
    const reach = node.reach || { state: "unknown" };
    const models = node.models.length + " model(s): " + node.models.join(", ");
    if (reach.state === "not-polled") return "static list, " + models;
    if (!node.inventoryKnown) return reach.state === "unreachable" ? "never answered" : "unknown";
    const polled = "polled " + ago(node.inventoryAt);
    return reach.state === "unreachable" ? "last known " + models + " (" + polled + ")"
      : models + " (" + polled + ")";
  }

  function ttftText(ttft) {
    if (!ttft) return "—";
    return ttft.medianMs + " ms (median of " + ttft.samples + ")";
  }

  function answers(n) {
    return n + (n === 1 ? " answer" : " answers");
  }

  // A node's prompt cache over its last answers, as its engine said it (never 0 % when it
  // says nothing: llama.cpp says, Ollama and LM Studio do not).
  function cacheText(cache) {
    if (!cache) return "—";
    if (!cache.stated) return "not said by its engine (" + answers(cache.answers) + ")";
    const share = cache.promptTokens ? Math.round((100 * cache.cachedTokens) / cache.promptTokens) : 0;
    const said = cache.stated === cache.answers ? answers(cache.answers)
      : cache.stated + " of " + answers(cache.answers);
    const text = share + " % cached: " + cache.cachedTokens + " of " + cache.promptTokens +
      " prompt tokens (" + said + ")";
    return cache.expectedWarm ? text + " · " + cache.expectedWarm + " sent there expected warm" : text;
  }

  function nodeRow(facade, node) {
    const s = node.state;
    const cell = el("td", null, "state " + s.state);
    cell.appendChild(el("div", stateText(s)));
    const loaded = Array.isArray(node.loaded)
      ? (node.loaded.length ? node.loaded.join(", ") : "none")
      : "unknown";
    const slots = (node.slotsInUse || 0) + " / " + (node.slots ? node.slots : "∞ unlimited");
    const tr = row([el("td", node.id, "node"), cell, el("td", ttftText(node.ttft), "ttft n"),
      el("td", cacheText(node.cache), "cache"), el("td", slots, "slots"), el("td", node.inFlight || 0, "inflight n"),
      el("td", node.busyWaits || 0, "busy-waits n"), el("td", node.reservations, "n"),
      el("td", inventoryText(node), "inventory" + (node.inventoryKnown ? "" : " bad")),
      el("td", loaded, Array.isArray(node.loaded) ? "loaded" : "loaded muted"),
      el("td", contextsText(node.contexts), "contexts"),
      el("td", node.kind || "", "kind"), el("td", node.url, "url muted"),
      el("td", ago(node.lastSuccess), "last-success"),
      el("td", measuredRates(node.rates), "rates")]);
    tr.dataset.node = facade.engine + "/" + node.id;
    return tr;
  }

  const NODE_COLUMNS = ["node", "state", "first token", "prompt cache", "slots", "in flight",
    "busy waits", "reservations", "inventory", "loaded", "context", "kind", "url", "last success",
    "measured rates"];

  function renderFacades() {
    const root = document.getElementById("facades");
    root.replaceChildren();
    for (const facade of state.facades) {
      const title = el("h2", facade.engine + " facade ");
      title.appendChild(el("span", facade.listening ? "listening" : "not listening",
        facade.listening ? "ready" : "bad"));
      if (facade.pin) title.appendChild(el("span", " · pinned to " + facade.pin, "muted"));
      title.appendChild(el("span", " · queue: ", "muted"));
      title.appendChild(el("span", facade.queueDepth || 0, "queue-depth"));
      title.appendChild(el("span", queueByPriority(facade.queue), "queue-priorities muted"));
      root.appendChild(title);
      const table = el("table");
      table.dataset.engine = facade.engine;
      const head = el("thead");
      head.appendChild(row(NODE_COLUMNS.map((t) => el("th", t))));
      table.appendChild(head);
      const body = el("tbody");
      for (const node of facade.nodes) body.appendChild(nodeRow(facade, node));
      table.appendChild(body);
      const scroll = el("div", null, "scroll");
      scroll.appendChild(table);
      root.appendChild(scroll);
    }
  }

  // --- requests: in flight (phase events), recent and counted (the board's) --------------------

  const PHASES = {
    "received": "received",
    "answering": "answered by the proxy",
    "queued": "queued",
    "waiting-headers": "waiting for headers",
    "reading-prompt": "reading the prompt",
    "streaming": "streaming",
  };

  function renderInFlight() {
    const body = document.querySelector("#inflight tbody");
    body.replaceChildren();
    const requests = Array.from(state.inFlight.values()).sort((a, b) => a.since - b.since);
    if (!requests.length) emptyRow(body, 7, "no request in flight");
    for (const p of requests) {
      const tr = row([el("td", PHASES[p.phase] || p.phase, "phase " + p.phase),
        el("td", p.node_id || "—"), el("td", p.model || "—"), el("td", p.key || "—"),
        el("td", seconds(now() - p.since)), el("td", p.method + " " + p.path),
        el("td", p.id, "muted")]);
      tr.dataset.id = p.id;
      body.appendChild(tr);
    }
  }

  const CHOSEN = {
    target: "named by X-NVPair-Node",
    pin: "pinned by the operator",
    affinity: "holds the conversation's prefix",
    session: "home of the client's session",
    conversation: "holds the response it continues",
    prediction: "predicted to answer first",
    order: "first in the candidate order",
    failover: "an earlier node failed",
    fallback: "a fallback model",
  };

  function renderRecent() {
    const body = document.querySelector("#recent tbody");
    body.replaceChildren();
    if (!state.recent.length) emptyRow(body, 12, "no request yet");
    for (const r of state.recent) {
      const tokens = r.tokensPerS === null || r.tokensPerS === undefined ? "—" : rate(r.tokensPerS);
      const cached = r.cachedTokens === null || r.cachedTokens === undefined ? "—"
        : r.cachedTokens + " of " + (r.promptTokens === null ? "?" : r.promptTokens);
      const tr = row([el("td", r.status === null ? "none" : r.status, "status " + r.verdict),
        el("td", r.node || "—"), el("td", r.chosenBy ? CHOSEN[r.chosenBy] || r.chosenBy : "—", "why"),
        el("td", duration(r.ttftMs), "n"), el("td", tokens, "n"), el("td", cached, "cached n"),
        el("td", r.model || "—"),
        el("td", r.key || "—"), el("td", r.method + " " + r.path), el("td", duration(r.durationMs), "n"),
        el("td", ago(r.at)), el("td", r.error || "", "error")]);
      tr.dataset.id = r.id;
      body.appendChild(tr);
    }
  }

  const VERDICTS = ["answered", "refused", "failed", "cancelled"];
  const NONE = { key: "no key", model: "no model" };

  function renderCounts(id, column, rows) {
    const body = document.querySelector("#" + id + " tbody");
    body.replaceChildren();
    if (!rows.length) emptyRow(body, 6, "no request yet");
    for (const r of rows) {
      const name = r.others ? "others" : r[column] === null ? NONE[column] : r[column];
      const cells = [el("td", name), el("td", r.requests, "n")];
      for (const v of VERDICTS) cells.push(el("td", r[v], "n" + (r[v] && v !== "answered" ? " " + v : "")));
      const tr = row(cells);
      tr.dataset[column] = r[column] === null ? "" : r[column];
      body.appendChild(tr);
    }
  }

  // --- pulls and creates fanned out to several nodes -------------------------------------------

  function progressText(part) {
    if (!part.total) return "—";
    return bytes(part.completed) + " of " + bytes(part.total) + " (" +
      Math.floor((100 * part.completed) / part.total) + "%)";
  }

  function resultText(part) {
    if (part.state === "failed") return "failed: " + (part.error || "error");
    return part.state;
  }

  function renderPulls() {
    const root = document.getElementById("pulls");
    root.replaceChildren();
    if (!state.fanOuts.length) {
      root.appendChild(el("div", "none running (X-NVPair-Node: * with /api/pull or /api/create)", "muted"));
      return;
    }
    for (const f of state.fanOuts) {
      const box = el("div");
      box.dataset.fanout = f.id;
      const title = f.path + (f.model ? " " + f.model : "") + " on " + f.nodes.length + " nodes · " +
        (f.ended ? "ended" : "running for " + seconds(now() - f.since));
      box.appendChild(el("h3", title, "fan-out-title"));
      const table = el("table");
      const body = el("tbody");
      for (const part of f.nodes) {
        const bar = el("progress");
        if (part.total) {
          bar.max = part.total;
          bar.value = part.completed;
        }
        const progress = el("td", null, "progress");
        progress.appendChild(el("span", progressText(part)));
        progress.appendChild(bar);
        const tr = row([el("td", part.node_id), progress,
          el("td", resultText(part), "result " + part.state)]);
        tr.dataset.node = part.node_id;
        body.appendChild(tr);
      }
      table.appendChild(body);
      const scroll = el("div", null, "scroll");
      scroll.appendChild(table);
      box.appendChild(scroll);
      root.appendChild(box);
    }
  }

  function fanOutSeen(p) {
    const ended = p.nodes.every((n) => !["asked", "running"].includes(n.state));
    const others = state.fanOuts.filter((f) => f.id !== p.id);
    const running = others.filter((f) => !f.ended);
    const done = others.filter((f) => f.ended);
    const seen = Object.assign({}, p, { ended });
    state.fanOuts = ended ? [...running, seen, ...done].slice(0, running.length + MAX_ENDED_FAN_OUTS)
      : [seen, ...running, ...done];
  }

  function render() {
    document.getElementById("run-id").textContent = state.runId || "…";
    document.getElementById("version").textContent = state.version ? "nvpair-tw " + state.version : "…";
    renderAddresses();
    renderFacades();
    renderInFlight();
    renderPulls();
    renderRecent();
    renderCounts("requests-by-key", "key", state.byKey);
    renderCounts("requests-by-model", "model", state.byModel);
    const failovers = document.getElementById("failovers");
    failovers.replaceChildren();
    for (const f of state.failovers) {
      const path = (f.attempts || []).map((a) => a.node_id + " " + a.outcome + " (" + a.ms + " ms)");
      failovers.appendChild(row([ago(f.at), path.join(" → "), f.node_id || "—", f.status, f.id,
        f.engine, f.path]));
    }
  }

  // --- the throughput chart: one polyline per node, inline SVG ---------------------------------
  const SVG = "http://www.w3.org/2000/svg";
  const CHART = { width: 960, height: 260, left: 56, right: 16, top: 14, bottom: 40 };
  const COLOURS = ["#0a66c2", "#d1495b", "#2a9d8f", "#e9a23b", "#6a4c93", "#3d5a80", "#8ab17d",
    "#b5651d"];

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  function niceCeiling(value) {
    if (!(value > 0)) return 1;
    const power = Math.pow(10, Math.floor(Math.log10(value)));
    for (const step of [1, 2, 4, 6, 8, 10]) if (value <= step * power) return step * power;
    return 10 * power;
  }

  function rate(value) {
    return value >= 10 || value === 0 ? value.toFixed(0) : value.toFixed(1);
  }

  function tick(value) {
    return String(Number(value.toFixed(2)));  // 0.25, 2.5, 250: no rounding to a wrong label
  }

  function renderChart() {
    const chart = document.getElementById("throughput-chart");
    const legend = document.getElementById("throughput-legend");
    const data = state.throughput;
    const series = data ? data.series : [];
    const bucket = data ? data.bucketSeconds * 1000 : 10000;
    const start = data ? data.since : 0;
    const points = series.length ? series[0].points.length : 90;
    const span = Math.max(1, (points - 1) * bucket);
    const c = CHART;
    const plotWidth = c.width - c.left - c.right;
    const plotHeight = c.height - c.top - c.bottom;
    let peak = 0;
    for (const s of series) for (const [, v] of s.points) peak = Math.max(peak, v);
    const top = niceCeiling(peak);
    const x = (t) => c.left + ((t - start) / span) * plotWidth;
    const y = (v) => c.top + plotHeight - (v / top) * plotHeight;
    chart.replaceChildren();
    chart.dataset.series = String(series.length);
    for (let i = 0; i <= 4; i++) {
      const value = (top * i) / 4;
      chart.appendChild(svg("line", { class: i ? "grid" : "axis", x1: c.left, x2: c.width - c.right,
        y1: y(value), y2: y(value) }));
      chart.appendChild(svg("text", { x: c.left - 6, y: y(value) + 4, "text-anchor": "end" },
        tick(value)));
    }
    chart.appendChild(svg("line", { class: "axis", x1: c.left, x2: c.left, y1: c.top,
      y2: c.top + plotHeight }));
    for (const minutes of [15, 10, 5, 0]) {
      const at = c.left + plotWidth * Math.max(0, 1 - (minutes * 60000) / span);
      chart.appendChild(svg("line", { class: "axis", x1: at, x2: at, y1: c.top + plotHeight,
        y2: c.top + plotHeight + 4 }));
      chart.appendChild(svg("text", { x: at, y: c.top + plotHeight + 18,
        "text-anchor": minutes === 15 ? "start" : minutes === 0 ? "end" : "middle" },
      minutes ? "−" + minutes + " min" : "now"));
    }
    chart.appendChild(svg("text", { x: c.left + plotWidth / 2, y: c.height - 4,
      "text-anchor": "middle" }, "time (" + bucket / 1000 + " s buckets)"));
    chart.appendChild(svg("text", { x: 14, y: c.top + plotHeight / 2, "text-anchor": "middle",
      transform: "rotate(-90 14 " + (c.top + plotHeight / 2) + ")" }, "tokens / s"));
    legend.replaceChildren();
    if (!series.length) {
      chart.appendChild(svg("text", { class: "empty", x: c.left + plotWidth / 2,
        y: c.top + plotHeight / 2, "text-anchor": "middle" }, "no tokens yet"));
      return;
    }
    const engines = new Set(series.map((s) => s.engine));
    series.forEach((s, i) => {
      const colour = COLOURS[i % COLOURS.length];
      const name = engines.size > 1 ? s.engine + "/" + s.node : s.node;
      const line = svg("polyline", { stroke: colour,
        points: s.points.map(([t, v]) => x(t).toFixed(1) + "," + y(v).toFixed(1)).join(" ") });
      line.dataset.node = s.engine + "/" + s.node;
      line.appendChild(svg("title", {}, name));
      chart.appendChild(line);
      for (const [t, v] of s.points) {  // a dot where tokens were served: a lone bucket shows
        if (v > 0) chart.appendChild(svg("circle", { cx: x(t), cy: y(v), r: 2.5, fill: colour }));
      }
      const item = el("li");
      item.dataset.node = s.engine + "/" + s.node;
      const swatch = el("span", null, "swatch");
      swatch.style.background = colour;
      item.appendChild(swatch);
      item.appendChild(el("span", name));
      const last = s.points.length ? s.points[s.points.length - 1][1] : 0;
      const busiest = Math.max(...s.points.map(([, v]) => v));
      item.appendChild(el("span", " peak " + rate(busiest) + " tok/s, now " + rate(last), "muted"));
      legend.appendChild(item);
    });
  }

  // --- the last 24 hours: /api/usage by key and by model ---------------------------------------
  const USAGE_REFRESH_MS = 30000;
  const USAGE_THROTTLE_MS = 2000;

  function usageRows(id, column, rows) {
    const body = document.querySelector("#" + id + " tbody");
    body.replaceChildren();
    if (!rows.length) {
      const empty = el("td", "no requests in the last 24 hours", "muted");
      empty.colSpan = 6;
      body.appendChild(row([empty]));
      return;
    }
    for (const r of rows) {
      const name = r[column] === null || r[column] === undefined ? "—" : r[column];
      const tr = row([el("td", name), el("td", r.requests, "n"), el("td", r.errors, "n"),
        el("td", r.prompt_tokens, "n"), el("td", r.completion_tokens, "n"),
        el("td", cachedTokens(r), "n")]);
      tr.dataset[column] = String(name);
      body.appendChild(tr);
    }
  }

  // The cached prompt tokens of a usage row: "—" when no engine said (or the proxy that kept
  // it is older), and how many requests' engines did not say.
  function cachedTokens(r) {
    const unsaid = r.unknown_cached === undefined ? r.requests : r.unknown_cached;
    if (r.cached_tokens === undefined || unsaid >= r.requests) return "—";
    return r.cached_tokens + (unsaid ? " (" + unsaid + " not said)" : "");
  }

  async function usageOf(by) {
    const response = await fetch("api/usage?since=24h&by=" + by, { cache: "no-store" });
    let answer = null;
    try {
      answer = await response.json();
    } catch (error) {
      answer = null;
    }
    if (!response.ok || !answer || !Array.isArray(answer.rows)) {
      const code = answer && answer.code ? answer.code : "HTTP " + response.status;
      throw new Error(response.status === 404 ? "" : code);
    }
    return answer;
  }

  async function loadUsage() {
    const off = document.getElementById("usage-off");
    const tables = document.getElementById("usage");
    const scope = document.getElementById("usage-scope");
    let byKey, byModel;
    try {
      [byKey, byModel] = await Promise.all([usageOf("key"), usageOf("model")]);
    } catch (error) {
      off.textContent = "usage history is off" + (error.message ? " (" + error.message + ")" : "");
      off.hidden = false;
      tables.hidden = true;
      scope.textContent = "";
      return;
    }
    // outside the try: a rendering bug is a page error, never "usage history is off"
    usageRows("usage-by-key", "key", byKey.rows);
    usageRows("usage-by-model", "model", byModel.rows);
    scope.textContent = byKey.scope === "fleet" ? "· whole fleet" : "· this proxy";
    off.hidden = true;
    tables.hidden = false;
  }

  let usageTimer = null;
  let usageAt = 0;
  function refreshUsageSoon() {
    if (usageTimer !== null) return;
    const wait = Math.max(0, usageAt + USAGE_THROTTLE_MS - Date.now());
    usageTimer = setTimeout(() => {
      usageTimer = null;
      usageAt = Date.now();
      loadUsage();
    }, wait);
  }

  async function load() {
    let snapshot;
    try {
      const response = await fetch("api/state", { cache: "no-store" });
      snapshot = await response.json();
    } catch (error) {
      document.getElementById("connection").textContent = "snapshot failed, retrying";
      return;
    }
    // outside the try: a rendering bug is a page error, never "snapshot failed"
    state.offset = snapshot.now - Date.now();
    state.runId = snapshot.runId;
    state.version = snapshot.version;
    state.facades = snapshot.facades;
    const requests = snapshot.requests;
    state.inFlight = new Map(requests.inFlight.map((p) => [p.id, p]));
    state.recent = requests.recent;
    state.byKey = requests.byKey;
    state.byModel = requests.byModel;
    state.fanOuts = snapshot.fanOuts;
    state.failovers = snapshot.failovers;
    state.throughput = snapshot.throughput || null;
    const store = document.getElementById("store");
    store.hidden = !snapshot.store;
    if (snapshot.store) {
      store.textContent = "fleet store " + snapshot.store.store + ": " + snapshot.store.state +
        (snapshot.store.state === "down" ? " (working on local state)" : "");
    }
    render();
    renderChart();
  }

  // Node states, slots, queue, counts and recent requests are the board's: a request, workload
  // or node event (which is when they change) re-reads the snapshot, at most once per REFRESH_MS.
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
    "request/phase": (p) => state.inFlight.set(p.id, p),
    "fan-out/progress": fanOutSeen,
    "proxy/request": (p) => {
      state.inFlight.delete(p.id);
      if ((p.attempts || []).length > 1 && !state.failovers.some((f) => f.id === p.id)) {
        state.failovers.unshift({ at: now(), id: p.id, engine: p.engine, path: p.path,
          node_id: p.node_id, status: p.status, attempts: p.attempts });
        state.failovers.length = Math.min(state.failovers.length, MAX_FAILOVERS);
      }
    },
  };
  const REFRESHING = ["request/phase", "fan-out/progress", "proxy/request", "workload:queued", "workload:started", "workload:completed",
    "workload:errored", "node/cooldown", "node/cooldown-ended", "node/cordon", "node/uncordon"];

  const events = new EventSource("events");
  const connection = document.getElementById("connection");
  events.onopen = () => {
    connection.textContent = "live";
    connection.className = "ready";
    load();
    refreshUsageSoon();
  };
  events.onerror = () => {
    connection.textContent = "reconnecting…";
    connection.className = "bad";
  };
  for (const name of new Set([...Object.keys(handlers), ...REFRESHING])) {
    events.addEventListener(name, (message) => {
      const payload = JSON.parse(message.data);
      if (handlers[name]) {
        handlers[name](payload);
        render();
      }
      if (REFRESHING.includes(name)) refreshSoon();
      if (name === "proxy/request" && payload.model) refreshUsageSoon();
    });
  }
  setInterval(render, 500);
  setInterval(load, 10000);
  setInterval(refreshUsageSoon, USAGE_REFRESH_MS);
  render();
  renderChart();
})();
