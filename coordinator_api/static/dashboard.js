// The control plane's dashboard: plain DOM, no dependencies. Every value from the API is put
// into the page as text (textContent, setAttribute, SVG attributes), never parsed as HTML.
(() => {
  "use strict";

  const TOKEN_KEY = "pulsar-txn.api-token";
  const REFRESH_MS = 3000;
  const REPLAY_POLL_MS = 600;
  const REPLAY_POLL_LIMIT_MS = 10 * 60 * 1000;
  const STATES = ["COMMITTED", "ABORTED", "OPEN"];
  const TERMINAL = new Set(["succeeded", "noop", "failed"]);
  const SVG_NS = "http://www.w3.org/2000/svg";
  const LIST_LIMIT = 50;

  const params = new URLSearchParams(window.location.search);
  const cache = { problems: [], problemsTotal: 0, batches: [], batchesTotal: 0, slow: [], open: [], openTotal: 0 };
  const replays = new Map(); // batch id -> {replayId, status, trail, message, error}
  const aborts = new Map(); // transaction id -> {pending, error}: aborts requested from this page
  const signatures = new Map(); // table id -> signature of what it shows
  let refreshing = false;
  let again = false;
  let refreshes = 0;
  let timer = null;

  const $ = (id) => document.getElementById(id);

  // ------------------------------------------------------------------ helpers

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else node.setAttribute(k, String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  const pad = (n) => String(n).padStart(2, "0");

  function clock(ms) {
    if (ms === null || ms === undefined) return "–";
    const d = new Date(ms);
    return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  function stamp(ms) {
    if (ms === null || ms === undefined) return "–";
    const d = new Date(ms);
    const today = new Date();
    const day = d.toDateString() === today.toDateString() ? "" :
      `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} `;
    return day + clock(ms);
  }

  function duration(ms) {
    if (ms === null || ms === undefined) return "–";
    if (ms < 1000) return `${Math.round(ms)} ms`;
    const s = ms / 1000;
    if (s < 60) return `${s.toFixed(s < 10 ? 2 : 1)} s`;
    const m = Math.floor(s / 60);
    if (m < 60) return `${m} min ${Math.round(s - m * 60)} s`;
    return `${Math.floor(m / 60)} h ${m % 60} min`;
  }

  const num = (v) => (v === null || v === undefined ? "–" : Number(v).toLocaleString("en-US"));

  function pill(text, kind, testid) {
    return el("span", { class: `pill ${kind}`, "data-testid": testid, "data-status": text }, text);
  }

  function mono(text, title) {
    return el("span", { class: "mono", title: title || text }, text);
  }

  // ---------------------------------------------------------------- the API

  class HttpError extends Error {
    constructor(status, detail, path) {
      super(`HTTP ${status}: ${detail}`);
      this.status = status;
      this.detail = detail;
      this.path = path;
    }
  }

  const token = () => window.sessionStorage.getItem(TOKEN_KEY) || "";

  async function api(path, { method = "GET", allow = [] } = {}) {
    const headers = { Accept: "application/json" };
    const t = token();
    if (t) headers.Authorization = `Bearer ${t}`;
    let resp;
    try {
      resp = await fetch(path, { method, headers, cache: "no-store" });
    } catch (exc) {
      throw new HttpError(0, `request failed (${exc.message})`, path);
    }
    const text = await resp.text();
    let body = text;
    try {
      body = text ? JSON.parse(text) : null;
    } catch (_) {
      // not JSON: keep the text
    }
    if (!resp.ok && !allow.includes(resp.status)) {
      const detail = body && typeof body === "object" && typeof body.detail === "string" ? body.detail
        : (typeof body === "string" && body ? body.slice(0, 300) : resp.statusText);
      throw new HttpError(resp.status, detail, path);
    }
    return body;
  }

  const q = (o) => {
    const p = new URLSearchParams();
    for (const [k, v] of Object.entries(o)) if (v !== "" && v !== null && v !== undefined) p.set(k, String(v));
    const s = p.toString();
    return s ? `?${s}` : "";
  };

  // ------------------------------------------------------------------ tables

  // Replace a table's rows only when what it shows changed (keeps buttons stable under the cursor).
  function fillTable(id, items, rowOf, emptyText, extraSignature) {
    const sig = JSON.stringify([items, extraSignature || null]);
    if (signatures.get(id) === sig) return;
    signatures.set(id, sig);
    const table = $(id);
    const tbody = table.tBodies[0];
    const cols = table.tHead.rows[0].cells.length;
    const rows = items.map(rowOf);
    if (!rows.length) rows.push(el("tr", { class: "empty" }, el("td", { colspan: cols }, emptyText)));
    tbody.replaceChildren(...rows);
    table.dataset.rows = String(items.length);
  }

  function statusPill(status) {
    return pill(status, `status-${status}`, "status");
  }

  function replayCell(batch, detailed) {
    const local = replays.get(batch.batch_id);
    const server = batch.replay || null;
    const cell = el("td", { class: "replay-cell", "data-testid": "replay" });
    const mine = local && local.status ? local : null; // a replay requested from this page, polled here
    const status = mine ? mine.status : (server ? server.status : null);
    if (status) {
      const message = mine ? mine.message : server.message;
      const badge = pill(status, `replay-${status}`, "replay-status");
      if (message) badge.title = message;
      cell.append(badge);
      const trail = mine ? mine.trail : [status];
      cell.append(el("span", { class: "trail", "data-testid": "replay-trail" }, trail.join(" → ")));
      if (message && detailed) cell.append(el("div", { class: "small", "data-testid": "replay-detail" }, message));
    }
    if (local && local.error) {
      cell.append(el("div", { class: "small error-text", "data-testid": "replay-error" }, local.error));
    }
    if (batch.status === "PARKED" && (!status || status === "failed") && !(local && local.pending)) {
      cell.append(el("button", {
        type: "button", class: "replay-button", "data-testid": "replay-button", "data-batch-id": batch.batch_id,
        "data-ledger-topic": batch.ledger_topic,
      }, status === "failed" ? "Retry replay" : "Replay"));
    }
    return cell;
  }

  function replaySignature(items) {
    const out = {};
    for (const b of items) {
      const r = replays.get(b.batch_id);
      if (r) out[b.batch_id] = [r.status, r.trail.join(), r.message, r.error, r.pending];
    }
    return out;
  }

  // The Abort button of a live transaction, and the outcome of an abort asked for from this page.
  function abortCell(txnId, abortable) {
    const cell = el("td", { class: "abort-cell", "data-testid": "abort" });
    const local = aborts.get(txnId);
    if (txnId && abortable) {
      const pending = Boolean(local && local.pending);
      cell.append(el("button", {
        type: "button", class: "danger", "data-testid": "abort-button", "data-txn-id": txnId, disabled: pending,
      }, pending ? "Aborting…" : "Abort"));
    }
    if (local && local.error) {
      cell.append(el("div", { class: "small error-text", "data-testid": "abort-error" }, local.error));
    }
    return cell;
  }

  function abortSignature(items) {
    const out = {};
    for (const t of items) {
      const a = aborts.get(t.txn_id);
      if (a) out[t.txn_id] = [a.pending, a.error];
    }
    return out;
  }

  function errorCell(text) {
    if (!text) return el("td", {}, "–");
    return el("td", { class: "error-cell", title: text }, text);
  }

  function problemRow(b) {
    return el("tr", { "data-key": b.batch_id, "data-testid": "problem-row" },
      el("td", {}, mono(b.batch_id)),
      el("td", {}, b.job),
      el("td", {}, statusPill(b.status)),
      el("td", { class: "num" }, num(b.attempts)),
      el("td", { class: "num" }, num(b.inputs)),
      el("td", {}, stamp(b.ended_at_ms)),
      errorCell(b.error),
      replayCell(b, true));
  }

  function batchRow(b) {
    const status = statusPill(b.status);
    if (b.error) status.title = b.error;
    return el("tr", { "data-key": b.batch_id, "data-testid": "batch-row" },
      el("td", {}, mono(b.batch_id)),
      el("td", {}, b.job),
      el("td", {}, status),
      el("td", { class: "num" }, num(b.attempts)),
      el("td", { class: "num" }, num(b.inputs)),
      el("td", { class: "num" }, num(b.outputs)),
      el("td", {}, stamp(b.started_at_ms)),
      el("td", { class: "num" }, duration(b.duration_ms)),
      el("td", {}, b.txn_id ? mono(b.txn_id) : "–"),
      replayCell(b, false));
  }

  function renderProblems() {
    fillTable("problems-table", cache.problems, problemRow, "no aborted or parked batches",
      replaySignature(cache.problems));
    $("problems-total").textContent = `${num(cache.problemsTotal)} in all`;
  }

  function renderBatches() {
    fillTable("batches-table", cache.batches, batchRow, "no batches", replaySignature(cache.batches));
    $("batches-total").textContent = `latest ${num(cache.batches.length)} of ${num(cache.batchesTotal)}`;
  }

  // ------------------------------------------------------------------- loaders

  async function loadHealth() {
    const h = await api("/health", { allow: [503] });
    const badge = $("health");
    badge.textContent = h.status === "ok" ? "healthy" : "degraded";
    badge.dataset.status = h.status;
    badge.className = `badge ${h.status === "ok" ? "ok" : "bad"}`;
    const parts = [`broker: ${h.broker.detail}`, `database: ${h.database.detail}`];
    for (const p of h.projection || []) {
      parts.push(`${p.topic}: ${p.records} records${p.error ? ` (${p.error})` : ""}`);
    }
    badge.title = parts.join("\n");
  }

  function chartWindow() {
    const [w, b] = $("chart-window").value.split(":").map(Number);
    return { window_s: w, bucket_s: b };
  }

  async function loadChart() {
    const win = chartWindow();
    const ts = await api(`/transactions/timeseries${q(win)}`);
    drawChart(ts, win);
  }

  function niceMax(v) {
    if (v <= 4) return 4;
    const mag = 10 ** Math.floor(Math.log10(v));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * mag >= v) return m * mag;
    return 10 * mag;
  }

  let lastChart = null;

  function drawChart(ts, win) {
    lastChart = [ts, win];
    const chart = $("txn-chart");
    const W = Math.max(Math.round(chart.clientWidth) || 960, 320);
    const H = 260;
    chart.setAttribute("viewBox", `0 0 ${W} ${H}`);
    const m = { l: 48, r: 12, t: 12, b: 30 };
    const pw = W - m.l - m.r;
    const ph = H - m.t - m.b;
    const points = ts.points || [];
    const totals = { COMMITTED: 0, ABORTED: 0, OPEN: 0 };
    let peak = 0;
    for (const p of points) {
      let s = 0;
      for (const st of STATES) {
        totals[st] += p[st];
        s += p[st];
      }
      peak = Math.max(peak, s);
    }
    const top = niceMax(peak);
    const nodes = [];
    for (let i = 0; i <= 4; i++) {
      const v = (top * i) / 4;
      const y = m.t + ph - (ph * i) / 4;
      nodes.push(svg("line", { x1: m.l, x2: W - m.r, y1: y, y2: y, class: i ? "grid" : "axis" }));
      nodes.push(svg("text", { x: m.l - 6, y: y + 4, class: "tick", "text-anchor": "end" },
        Number.isInteger(v) ? v : v.toFixed(1)));
    }
    const n = Math.max(points.length, 1);
    const step = pw / n;
    const gap = step > 6 ? Math.min(step * 0.2, 4) : 0;
    const labelEvery = Math.max(1, Math.ceil(n / 8));
    points.forEach((p, i) => {
      const x = m.l + i * step;
      let y = m.t + ph;
      for (const st of STATES) {
        const c = p[st];
        if (!c) continue;
        const h = Math.max((c / top) * ph, 1);
        y -= h;
        const rect = svg("rect", {
          x: (x + gap / 2).toFixed(2), y: y.toFixed(2), width: Math.max(step - gap, 0.5).toFixed(2),
          height: h.toFixed(2), class: `seg seg-${st}`, "data-state": st, "data-count": c, "data-t": p.t_ms,
        });
        rect.append(svg("title", {}, `${clock(p.t_ms)}–${clock(p.t_ms + ts.bucket_ms)}: ${c} ${st.toLowerCase()}`));
        nodes.push(rect);
      }
      if (i % labelEvery === 0) {
        nodes.push(svg("line", { x1: x, x2: x, y1: m.t + ph, y2: m.t + ph + 4, class: "axis" }));
        nodes.push(svg("text", { x, y: H - 10, class: "tick", "text-anchor": "middle" }, clock(p.t_ms)));
      }
    });
    if (!totals.COMMITTED && !totals.ABORTED && !totals.OPEN) {
      nodes.push(svg("text", { x: m.l + pw / 2, y: m.t + ph / 2, class: "empty-chart", "text-anchor": "middle" },
        `no transactions in the last ${duration(win.window_s * 1000)}`));
    }
    chart.replaceChildren(...nodes);
    chart.dataset.buckets = String(points.length);
    chart.dataset.bucketMs = String(ts.bucket_ms);
    for (const st of STATES) {
      $(`total-${st}`).textContent = num(totals[st]);
      chart.dataset[`total${st}`] = String(totals[st]);
    }
  }

  function renderSlow() {
    const now = Date.now();
    fillTable("slow-table", cache.slow, (t) => el("tr", { "data-key": t.txn_id || "", "data-testid": "slow-row" },
      el("td", {}, mono(t.txn_id || "?")),
      el("td", {}, t.status ? pill(t.status, `txn-${t.status}`, "status") : "–"),
      el("td", {}, stamp(t.opened_at_ms)),
      el("td", { class: "num" }, duration(t.opened_at_ms ? now - t.opened_at_ms : t.age_ms)),
      el("td", { class: "num", title: t.produced_partitions.join("\n") }, num(t.produced_partitions.length)),
      el("td", { class: "num", title: t.acked_subscriptions.join("\n") }, num(t.acked_subscriptions.length)),
      abortCell(t.txn_id, !t.status || t.status === "OPEN")),
    "no slow transactions", [Math.floor(now / 1000), abortSignature(cache.slow)]);
  }

  function renderOpen() {
    const now = Date.now();
    fillTable("open-table", cache.open, (t) => el("tr", { "data-key": t.txn_id, "data-testid": "open-row" },
      el("td", {}, mono(t.txn_id)),
      el("td", {}, t.job),
      el("td", {}, mono(t.batch_id)),
      el("td", { class: "num" }, num(t.attempt)),
      el("td", {}, stamp(t.started_at_ms)),
      el("td", { class: "num" }, duration(now - t.started_at_ms)),
      abortCell(t.txn_id, true)),
    "no open transactions", [Math.floor(now / 1000), abortSignature(cache.open)]);
    $("open-total").textContent = `${num(cache.openTotal)} open`;
  }

  async function loadCoordinators() {
    const slowAfter = params.get("slow_after_ms");
    const c = await api(`/coordinators${q({ slow_after_ms: slowAfter })}`);
    $("slow-threshold").textContent = `older than ${duration(c.slow_after_ms)}`;
    cache.slow = c.slow_transactions;
    renderSlow();
    fillTable("coordinators-table", c.coordinators, (k) => el("tr", {
      "data-key": String(k.coordinator_id), "data-testid": "coordinator-row" },
    el("td", { class: "num" }, k.coordinator_id),
    el("td", {}, k.state ? pill(k.state, `coord-${k.state}`, "status") : "–"),
    el("td", { class: "num" }, num(k.ongoing)),
    el("td", { class: "num" }, num(k.low_water_mark)),
    el("td", {}, stamp(k.recover_end_ms))), "no coordinators");
  }

  async function loadOpen() {
    const page = await api(`/transactions${q({ state: "OPEN", limit: LIST_LIMIT })}`);
    cache.open = page.items;
    cache.openTotal = page.total;
    renderOpen();
  }

  function jobBatches(batches) {
    const wrap = el("span", { class: "pills" });
    for (const [status, n] of Object.entries(batches).sort()) {
      wrap.append(el("span", { class: `pill status-${status}`, "data-status": status, "data-count": n },
        `${status} ${num(n)}`));
    }
    return wrap;
  }

  async function loadJobs() {
    const jobs = await api("/jobs");
    fillTable("jobs-table", jobs, (j) => el("tr", { "data-key": j.job, "data-testid": "job-row" },
      el("td", { "data-testid": "job-name" }, j.job),
      el("td", { "data-testid": "job-batches" }, jobBatches(j.batches)),
      el("td", { class: "num", "data-testid": "job-total" }, num(j.total_batches)),
      el("td", { class: "num", "data-testid": "job-inputs" }, num(j.inputs_committed)),
      el("td", { class: "num", "data-testid": "job-outputs" }, num(j.outputs_committed)),
      el("td", { class: "num" }, j.throughput_per_s === null ? "–" : `${num(j.throughput_per_s)} msg/s`),
      el("td", { class: "num" }, `${duration(j.commit_p50_ms)} / ${duration(j.commit_p99_ms)}`),
      el("td", {}, stamp(j.last_commit_ms))), "no jobs in the ledger yet");
    const select = $("batch-job");
    const names = jobs.map((j) => j.job);
    const have = Array.from(select.options).slice(1).map((o) => o.value);
    if (JSON.stringify(have) !== JSON.stringify(names)) {
      const current = select.value;
      select.replaceChildren(el("option", { value: "" }, "all"), ...names.map((n) => el("option", { value: n }, n)));
      select.value = names.includes(current) ? current : "";
    }
  }

  async function loadProblems() {
    const [parked, replayed, aborted] = await Promise.all(["PARKED", "REPLAYED", "ABORTED"].map(
      (status) => api(`/batches${q({ status, limit: LIST_LIMIT })}`)));
    const items = [...parked.items, ...replayed.items, ...aborted.items];
    const rank = { PARKED: 0, REPLAYED: 1, ABORTED: 2 };
    items.sort((a, b) => rank[a.status] - rank[b.status] || b.started_at_ms - a.started_at_ms ||
      (a.batch_id < b.batch_id ? 1 : -1));
    cache.problems = items;
    cache.problemsTotal = parked.total + replayed.total + aborted.total;
    renderProblems();
  }

  // Ledger messages the projection could not use: shown raw (as text, never markup) with the reason.
  function quarantineRow(r) {
    const raw = r.raw.length > 200 ? `${r.raw.slice(0, 200)}…` : r.raw;
    return el("tr", { "data-key": String(r.id), "data-testid": "quarantine-row" },
      el("td", {}, mono(r.topic)),
      el("td", {}, mono(r.message_id)),
      el("td", {}, stamp(r.quarantined_at_ms)),
      errorCell(r.reason),
      el("td", { class: "num" }, num(r.size)),
      el("td", { class: "raw-cell" }, mono(raw, r.raw.slice(0, 2000))));
  }

  async function loadQuarantine() {
    const page = await api(`/quarantine${q({ limit: 20 })}`);
    $("quarantine-total").textContent = page.total ? `${num(page.total)} quarantined` : "";
    $("quarantine-section").dataset.total = String(page.total);
    fillTable("quarantine-table", page.items, quarantineRow, "no quarantined ledger messages");
  }

  async function loadBatches() {
    const page = await api(`/batches${q({ job: $("batch-job").value, status: $("batch-status").value,
      limit: LIST_LIMIT })}`);
    cache.batches = page.items;
    cache.batchesTotal = page.total;
    renderBatches();
  }

  // ------------------------------------------------------------------ refresh

  function describe(err) {
    if (err instanceof HttpError) {
      const hint = err.status === 401 ? " (enter the API token above)" : "";
      return `${err.path}: ${err.status ? `HTTP ${err.status}: ` : ""}${err.detail}${hint}`;
    }
    return String(err && err.message ? err.message : err);
  }

  async function refresh() {
    if (refreshing) {
      again = true; // a change while a refresh is under way: refresh once more right after it
      return;
    }
    refreshing = true;
    again = false;
    clearTimeout(timer);
    try {
      const results = await Promise.allSettled([
        loadHealth(), loadChart(), loadCoordinators(), loadOpen(), loadJobs(), loadProblems(), loadBatches(),
        loadQuarantine(),
      ]);
      const errors = results.filter((r) => r.status === "rejected").map((r) => describe(r.reason));
      const banner = $("load-error");
      banner.replaceChildren(...errors.map((e) => el("div", {}, e)));
      banner.hidden = errors.length === 0;
      refreshes += 1;
      document.body.dataset.refreshes = String(refreshes);
      $("last-refresh").textContent = `updated ${clock(Date.now())}`;
    } finally {
      refreshing = false;
      timer = setTimeout(refresh, again ? 0 : REFRESH_MS);
    }
  }

  // ------------------------------------------------------------------- replay

  function showMessage(kind, text, id = "replay-message") {
    const box = $(id);
    box.className = `banner ${kind}`;
    box.dataset.kind = kind;
    box.textContent = text;
    box.hidden = false;
  }

  function rerenderReplays() {
    renderProblems();
    renderBatches();
  }

  const REFUSALS = {
    401: "no API token was sent: enter it above",
    403: "the API token was refused",
    404: "the batch is not in the ledger",
    409: "the batch cannot be replayed",
  };

  async function replay(batchId, ledgerTopic) {
    const prior = replays.get(batchId);
    const state = { replayId: null, status: null, trail: [], message: null, error: null, pending: true };
    replays.set(batchId, state);
    showMessage("info", `Requesting a replay of batch ${batchId}…`);
    rerenderReplays();
    let rep;
    try {
      rep = await api(`/batches/${encodeURIComponent(batchId)}/replay${q({ ledger_topic: ledgerTopic })}`,
        { method: "POST" });
    } catch (err) {
      const status = err instanceof HttpError ? err.status : 0;
      const why = REFUSALS[status] || "the request failed";
      const text = `Replay of batch ${batchId} refused: ${status ? `HTTP ${status}` : "no answer"} – ${why}. ` +
        `${err instanceof HttpError ? err.detail : String(err)}`;
      if (prior && prior.replayId) replays.set(batchId, prior);
      else replays.set(batchId, { ...state, pending: false, error: `HTTP ${status}: ${why}` });
      showMessage("error", text);
      $("replay-message").dataset.status = String(status);
      rerenderReplays();
      return;
    }
    state.pending = false;
    track(state, rep);
    $("replay-message").dataset.status = "202";
    showMessage("info", `Replay of batch ${batchId} ${rep.status} (replay ${rep.replay_id}).`);
    rerenderReplays();
    await poll(batchId, state);
  }

  function track(state, rep) {
    state.replayId = rep.replay_id;
    if (state.status !== rep.status) state.trail.push(rep.status);
    state.status = rep.status;
    state.message = rep.message;
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  async function poll(batchId, state) {
    const deadline = Date.now() + REPLAY_POLL_LIMIT_MS;
    while (!TERMINAL.has(state.status) && Date.now() < deadline) {
      await sleep(REPLAY_POLL_MS);
      try {
        track(state, await api(`/replays/${encodeURIComponent(state.replayId)}`));
        state.error = null;
      } catch (err) {
        state.error = describe(err);
      }
      rerenderReplays();
    }
    if (state.status === "succeeded" || state.status === "noop") {
      showMessage("success", `Replay of batch ${batchId} ${state.status}: ${state.message || ""}`);
    } else if (state.status === "failed") {
      showMessage("error", `Replay of batch ${batchId} failed: ${state.message || ""}`);
    } else {
      showMessage("error", `Replay of batch ${batchId} still ${state.status} after ` +
        `${duration(REPLAY_POLL_LIMIT_MS)}; the tables keep refreshing.`);
    }
    refresh();
  }

  // -------------------------------------------------------------------- abort

  const ABORT_REFUSALS = {
    401: "no API token was sent: enter it above",
    403: "the API token was refused",
    404: "the transaction is not known to its coordinator nor in the ledger",
    409: "the transaction has already ended",
  };

  function showTxnMessage(kind, text, status) {
    showMessage(kind, text, "txn-message");
    $("txn-message").dataset.status = status === null ? "" : String(status);
  }

  function rerenderTxns() {
    renderSlow();
    renderOpen();
  }

  // Abort a live transaction after a confirmation; the outcome shows above the tables.
  async function abortTxn(txnId) {
    const question = `Abort transaction ${txnId}?\n\nThe messages it produced are discarded and its ` +
      "acknowledgements undone. This cannot be undone.";
    if (!window.confirm(question)) return;
    aborts.set(txnId, { pending: true, error: null });
    showTxnMessage("info", `Aborting transaction ${txnId}…`, null);
    rerenderTxns();
    try {
      const res = await api(`/transactions/${encodeURIComponent(txnId)}/abort`, { method: "POST" });
      aborts.delete(txnId);
      showTxnMessage("success", `Transaction ${res.txn_id} is ${res.state}: the messages it produced are ` +
        "discarded and its acknowledgements undone.", 200);
    } catch (err) {
      const status = err instanceof HttpError ? err.status : 0;
      const why = ABORT_REFUSALS[status] || "the request failed";
      const code = status ? `HTTP ${status}` : "no answer";
      aborts.set(txnId, { pending: false, error: `${code}: ${why}` });
      showTxnMessage("error", `Abort of transaction ${txnId} refused: ${code} – ${why}. ` +
        `${err instanceof HttpError ? err.detail : String(err)}`, status);
    }
    rerenderTxns();
    refresh();
  }

  // -------------------------------------------------------------------- token

  function showTokenState() {
    $("token-state").textContent = token() ? "token set for this session" : "no token (read-only)";
    $("token-state").dataset.set = token() ? "yes" : "no";
  }

  function setup() {
    $("token-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const value = $("token-input").value.trim();
      if (value) window.sessionStorage.setItem(TOKEN_KEY, value);
      $("token-input").value = "";
      showTokenState();
      refresh();
    });
    $("token-clear").addEventListener("click", () => {
      window.sessionStorage.removeItem(TOKEN_KEY);
      $("token-input").value = "";
      showTokenState();
    });
    for (const id of ["problems-table", "batches-table"]) {
      $(id).addEventListener("click", (ev) => {
        const button = ev.target.closest("button[data-batch-id]");
        if (button) {
          button.disabled = true;
          replay(button.dataset.batchId, button.dataset.ledgerTopic);
        }
      });
    }
    for (const id of ["slow-table", "open-table"]) {
      $(id).addEventListener("click", (ev) => {
        const button = ev.target.closest("button[data-txn-id]");
        if (button && !button.disabled) abortTxn(button.dataset.txnId);
      });
    }
    for (const id of ["chart-window", "batch-job", "batch-status"]) {
      $(id).addEventListener("change", () => {
        signatures.clear();
        refresh();
      });
    }
    let resizing = null;
    window.addEventListener("resize", () => {
      clearTimeout(resizing);
      resizing = setTimeout(() => lastChart && drawChart(...lastChart), 150);
    });
    showTokenState();
    refresh();
  }

  window.pulsarTxnDashboard = { refresh, replay, abort: abortTxn };
  document.addEventListener("DOMContentLoaded", setup);
})();
