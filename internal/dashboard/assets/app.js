// vigil dashboard: polls the read-only JSON API and redraws the cards.
// No framework, no build step, nothing fetched from outside this server.
"use strict";

(function () {
  const params = new URLSearchParams(location.search);
  // Poll interval in seconds: ?interval=, 0.5–3600, default 3. A value out
  // of range is refused (said in the banner), never passed to setTimeout,
  // which would read a huge or infinite delay as 0 and flood the server.
  const intervalMin = 0.5, intervalMax = 3600, intervalDefault = 3;
  const intervalRaw = params.get("interval");
  const intervalAsked = intervalRaw === null ? intervalDefault : Number(intervalRaw);
  const intervalOK = Number.isFinite(intervalAsked) && intervalAsked >= intervalMin && intervalAsked <= intervalMax;
  const intervalS = intervalOK ? intervalAsked : intervalDefault;
  const timelineEveryS = 15;
  const rowsPerKind = 10; // rows shown per process kind before "show all"
  const foldKindsOver = 12; // with more kinds than this, only the newest six start open
  const svgNS = "http://www.w3.org/2000/svg";

  // Token: #token=… once, then kept for this tab only.
  const hashToken = new URLSearchParams(location.hash.slice(1)).get("token");
  if (hashToken) {
    sessionStorage.setItem("vigil-token", hashToken);
    history.replaceState(null, "", location.pathname + location.search);
  }
  const token = sessionStorage.getItem("vigil-token");

  const state = {
    paused: false,
    refreshes: 0,
    offsetMs: 0, // server clock − this browser's clock, from the snapshot's taken_at
    openKinds: new Set(),
    seenKinds: new Set(),
    expandedKinds: new Set(),
    timeline: null,
    timelineAt: 0,
    data: {},
  };
  window.vigilLoadId = Math.random().toString(36).slice(2); // a reload changes it

  // ---- helpers ----
  function h(tag, props, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v == null || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "text") el.textContent = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    for (const kid of kids.flat()) {
      if (kid == null || kid === false) continue;
      el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return el;
  }
  function svg(tag, attrs, ...kids) {
    const el = document.createElementNS(svgNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
    for (const kid of kids) if (kid) el.append(kid);
    return el;
  }
  const now = () => Date.now() + state.offsetMs;
  const ms = (t) => (t ? Date.parse(t) : NaN);

  function dur(msv) {
    if (!isFinite(msv)) return "—";
    const neg = msv < 0;
    let s = Math.abs(msv) / 1000;
    let out;
    if (s < 10) out = s.toFixed(1) + "s";
    else if (s < 90) out = Math.round(s) + "s";
    else if (s < 5400) out = Math.round(s / 60) + "m";
    else if (s < 172800) out = Math.floor(s / 3600) + "h " + Math.round((s % 3600) / 60) + "m";
    else out = Math.round(s / 86400) + "d";
    return neg ? "in " + out : out;
  }
  const ago = (t) => (t ? dur(now() - ms(t)) + " ago" : "—");
  const clockTime = (t) => (t ? new Date(ms(t)).toLocaleTimeString() : "");
  const short = (id) => (id ? String(id).slice(0, 8) : "—");
  const badge = (value, kind) => h("span", { class: "badge", "data-state": value, title: kind || null }, value || "—");

  async function api(path) {
    const headers = { Accept: "application/json" };
    if (token) headers.Authorization = "Bearer " + token;
    const res = await fetch(path, { headers, cache: "no-store" });
    let body = null;
    try { body = await res.json(); } catch (_) { /* not JSON */ }
    if (!res.ok) {
      const msg = body && body.error ? body.error.code + ": " + body.error.message : res.status + " " + res.statusText;
      const err = new Error(msg);
      err.status = res.status;
      throw err;
    }
    return body;
  }

  function fill(cardId, ...kids) {
    const body = document.querySelector("#" + cardId + " .body");
    body.replaceChildren(...kids.flat().filter((k) => k != null && k !== false));
  }
  function cardError(cardId, err) {
    fill(cardId, h("p", { class: "error" }, "could not read: " + err.message));
  }
  function table(headers, rows, attrs) {
    return h("table", attrs || {},
      h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))),
      h("tbody", {}, rows));
  }
  function empty(text) { return h("p", { class: "muted empty" }, text); }

  // ---- cards ----
  function renderSummary(d) {
    const tiles = [];
    if (d.processes) {
      const alive = d.processes.filter((p) => p.status === "alive").length;
      tiles.push(["processes alive", alive, alive ? "ok" : "warn"]);
      tiles.push(["processes stopped", d.processes.length - alive, ""]);
    }
    if (d.snapshot) {
      const by = {};
      for (const a of d.snapshot.agents) by[a.operational_state] = (by[a.operational_state] || 0) + 1;
      for (const k of ["working", "idle", "down", "telemetry_missing"]) {
        if (by[k] || k !== "telemetry_missing") tiles.push(["agents " + k.replace("_", " "), by[k] || 0, k === "down" || k === "telemetry_missing" ? (by[k] ? "bad" : "") : "ok"]);
      }
    }
    if (d.tasks) tiles.push(["tasks running", d.tasks.length, ""]);
    if (d.events) {
      const open = d.events.filter((e) => !e.delivered_at).length;
      tiles.push(["events undelivered", open, open ? "warn" : ""]);
    }
    document.getElementById("summary").replaceChildren(...tiles.map(([label, n, tone]) =>
      h("div", { class: "tile", "data-tone": tone }, h("div", { class: "n" }, n), h("div", { class: "label" }, label))));
  }

  function renderSweepers(list) {
    if (!list.length) return fill("card-sweepers", empty("no sweepers running"));
    fill("card-sweepers", table(["name", "every", "last run", "result", "took", "error"], list.map((s) =>
      h("tr", { "data-sweeper": s.name },
        h("td", {}, s.name), h("td", {}, dur(s.interval_s * 1000)),
        h("td", {}, s.last_run_at ? ago(s.last_run_at) : "not yet"),
        h("td", { class: "num" }, s.last_result_count), h("td", { class: "num" }, s.last_run_duration_ms.toFixed(1) + " ms"),
        h("td", { class: s.last_error ? "error" : "muted" }, s.last_error || "—")))));
  }

  // stripRange is what the strips show: the window asked for, or with
  // "auto" the last 6 h cut to where the fleet's history begins (at least
  // 5 min), so a young fleet is not a sliver at the right edge.
  function stripRange(tl) {
    const to = ms(tl.to);
    let from = ms(tl.from);
    if (document.getElementById("tl-window").value === "auto") {
      let first = to;
      for (const a of tl.agents) {
        first = Math.min(first, ms(a.registered_at));
        for (const u of a.up) first = Math.min(first, ms(u.from));
        for (const m of a.marks) first = Math.min(first, ms(m.at));
        for (const p of a.planned_stops) first = Math.min(first, ms(p.from));
        for (const d of a.declared_stopped || []) first = Math.min(first, ms(d.from));
        for (const d of a.stopped_on_purpose || []) first = Math.min(first, ms(d.from));
      }
      from = Math.max(from, Math.min(to - 5 * 60000, first - (to - first) * 0.05));
    }
    return [from, to];
  }

  function strip(agent) {
    const tl = state.timeline;
    const row = tl && tl.agents.find((a) => a.agent === agent);
    if (!row) return h("span", { class: "muted small" }, tl ? "not registered" : "");
    const [from, to] = stripRange(tl), span = to - from;
    const x = (t) => Math.max(0, Math.min(1000, ((ms(t) - from) / span) * 1000));
    const el = svg("svg", { class: "strip", viewBox: "0 0 1000 20", preserveAspectRatio: "none", role: "img", "data-agent": agent });
    el.append(svg("title", {}, document.createTextNode(agent + ": last " + dur(span))));
    el.append(svg("rect", { class: "track", x: 0, y: 4, width: 1000, height: 12 })); // before registration
    const since = x(row.registered_at); // not down before it was registered
    el.append(svg("rect", { class: "down", x: since, y: 4, width: 1000 - since, height: 12 }));
    const onPurpose = (spans, what) => {
      for (const d of spans || []) {
        const r = svg("rect", { class: "declared-stopped", x: x(d.from), y: 4, width: Math.max(1, x(d.to) - x(d.from)), height: 12 });
        r.append(svg("title", {}, document.createTextNode(what + " " + clockTime(d.from) + " – " + clockTime(d.to))));
        el.append(r);
      }
    };
    onPurpose(row.stopped_on_purpose, "stopped on purpose (its exit was suppressed)");
    onPurpose(row.declared_stopped, "declared stopped");
    for (const u of row.up) {
      const r = svg("rect", { class: "up", x: x(u.from), y: 4, width: Math.max(1, x(u.to) - x(u.from)), height: 12 });
      r.append(svg("title", {}, document.createTextNode("up " + clockTime(u.from) + " – " + clockTime(u.to))));
      el.append(r);
    }
    for (const p of row.planned_stops) {
      const r = svg("rect", { class: "planned", x: x(p.from), y: 0, width: Math.max(2, x(p.to) - x(p.from)), height: 3 });
      r.append(svg("title", {}, document.createTextNode("planned stop marker: until " + clockTime(p.to) + ", exits of the process running when it was written are suppressed (not of one started after it)")));
      el.append(r);
    }
    for (const m of row.marks) {
      const cls = m.suppressed ? "mark suppressed" : m.kind === "exit" ? "mark exit" : m.kind === "stall_kill" ? "mark stall" : "mark other";
      const r = svg("rect", { class: cls, "data-kind": m.kind, x: x(m.at) - 1.5, y: 0, width: 3, height: 20 });
      const what = m.kind + (m.exit_code != null ? " code " + m.exit_code : "") + (m.signal ? " " + m.signal : "") + (m.suppressed ? " (suppressed)" : "");
      r.append(svg("title", {}, document.createTextNode(clockTime(m.at) + " " + what)));
      el.append(r);
    }
    return h("div", { class: "strip-wrap" }, el, row.truncated ? h("span", { class: "small muted" }, "older history cut") : null);
  }

  function renderAgents(snap) {
    document.getElementById("host").textContent = snap.hostname ? "on " + snap.hostname : "";
    if (!snap.agents.length) return fill("card-agents", empty("no agents"));
    fill("card-agents", table(["agent", "declared", "process", "operational", "instance", "tasks", "latest event", "timeline"],
      snap.agents.map((a) => {
        const ev = a.latest_process_event;
        return h("tr", { "data-agent": a.agent, "data-operational": a.operational_state },
          h("td", {}, h("strong", {}, a.agent), h("div", { class: "small muted" }, a.source)),
          h("td", {}, badge(a.declared_status)),
          h("td", {}, badge(a.process_state, a.process_signal + (a.process_error ? ": " + a.process_error : ""))),
          h("td", {}, badge(a.operational_state),
            a.telemetry_errors && a.telemetry_errors.length ? h("div", { class: "small error" }, a.telemetry_errors.join("; ")) : null),
          h("td", { class: "small" }, a.instance_id ? short(a.instance_id) + " " + (a.hostname || "") + (a.pid ? " pid " + a.pid : "") : "—"),
          h("td", { class: "small" }, (a.running_tasks || []).map((t) => "#" + t.task_id + " " + t.task_type).join(", ") || "—"),
          h("td", { class: "small" }, ev ? [badge(ev.kind), " ", ago(ev.at), ev.delivery_kind === "suppressed" ? h("span", { class: "muted" }, " (suppressed)") : null] : "—"),
          h("td", { class: "timeline" }, a.source === "self" ? h("span", { class: "muted small" }, "this server") : strip(a.agent)));
      }), { class: "agents" }));
  }

  function heartbeatBar(p) {
    const windowMs = p.liveness_interval_s * 3000; // DESIGN L3: 3× the interval
    const age = now() - ms(p.last_heartbeat_at);
    const frac = Math.max(0, Math.min(1, age / windowMs));
    // exited: said goodbye (grey); dead: went silent past its window (red)
    const tone = p.exited_at ? "exited" : p.status === "stopped" ? "dead" : age > p.liveness_interval_s * 1500 ? "late" : "ok";
    const fillEl = h("div", { class: "hb-fill" });
    fillEl.style.width = (frac * 100).toFixed(1) + "%"; // CSSOM, which the CSP allows (inline style attributes it does not)
    return h("div", { class: "hb", title: "last heartbeat " + dur(age) + " ago; alive window " + dur(windowMs) },
      h("div", { class: "hb-bar", "data-tone": tone }, fillEl),
      h("span", { class: "small" }, p.exited_at ? "exited " + ago(p.exited_at) : dur(age) + " / " + dur(windowMs)));
  }

  function renderProcesses(procs, truncated) {
    const q = document.getElementById("proc-filter").value.trim().toLowerCase();
    const shown = q ? procs.filter((p) => [p.process_kind, p.hostname, p.instance_id].some((s) => String(s).toLowerCase().includes(q))) : procs;
    if (!shown.length) return fill("card-processes", empty(procs.length ? "nothing matches the filter" : "no process instances yet"));
    const kinds = new Map(); // insertion order = newest instance first
    for (const p of shown) {
      if (!kinds.has(p.process_kind)) kinds.set(p.process_kind, []);
      kinds.get(p.process_kind).push(p);
    }
    const groups = [];
    const foldFrom = kinds.size > foldKindsOver ? 6 : Infinity; // a big fleet starts folded past its 6 newest kinds
    let nth = 0;
    for (const [kind, list] of kinds) {
      nth++;
      if (!state.seenKinds.has(kind)) {
        state.seenKinds.add(kind);
        if (nth <= foldFrom) state.openKinds.add(kind);
      }
      const alive = list.filter((p) => p.status === "alive").length;
      const all = state.expandedKinds.has(kind);
      const rows = (all ? list : list.slice(0, rowsPerKind)).map((p) =>
        h("tr", { "data-instance": p.instance_id, "data-status": p.status },
          h("td", { title: p.instance_id }, h("code", {}, short(p.instance_id))),
          h("td", {}, badge(p.status)),
          h("td", { class: "host", title: p.hostname }, p.hostname), h("td", { class: "num" }, p.pid),
          h("td", {}, ago(p.started_at)),
          h("td", {}, heartbeatBar(p)),
          h("td", {}, p.current_task_id != null ? "#" + p.current_task_id + " " + (p.current_task_type || "") : "—")));
      const details = h("details", { "data-kind": kind, open: state.openKinds.has(kind),
        ontoggle: (e) => { e.target.open ? state.openKinds.add(kind) : state.openKinds.delete(kind); } },
        h("summary", {}, h("strong", {}, kind), " ",
          h("span", { class: "count ok" }, alive + " alive"), " ",
          h("span", { class: "count" }, (list.length - alive) + " stopped")),
        table(["instance", "status", "host", "pid", "started", "heartbeat age / alive window", "current task"], rows, { class: "procs" }),
        list.length > rowsPerKind ? h("button", { type: "button", class: "more",
          onclick: () => { all ? state.expandedKinds.delete(kind) : state.expandedKinds.add(kind); renderProcesses(state.data.processes, state.data.processesTruncated); } },
        all ? "show newest " + rowsPerKind : "show all " + list.length) : null);
      groups.push(details);
    }
    fill("card-processes", groups,
      truncated ? h("p", { class: "small muted" }, "Showing the newest 1,000 instances; filter by status or use `vigil ps --kind K`.") : null);
  }

  function expiry(t) {
    if (!t) return "—";
    const left = ms(t) - now();
    return left >= 0 ? "in " + dur(left) : h("span", { class: "error" }, "expired " + dur(-left) + " ago");
  }

  function renderTasks(tasks, procsById) {
    if (!tasks.length) return fill("card-tasks", empty("no task is running"));
    tasks.sort((a, b) => ms(a.started_at) - ms(b.started_at));
    fill("card-tasks", table(["task", "type", "holder", "epoch", "claimed", "last lease heartbeat", "last activity", "lease expires", "attempts"],
      tasks.map((t) => {
        const holder = procsById.get(t.lease_owner);
        return h("tr", { "data-task": t.task_id, "data-stalled": !!t.stalled },
          h("td", {}, "#" + t.task_id),
          h("td", {}, t.task_type, t.stalled ? [" ", badge("stalled", "its lease is renewed but its last activity is older than the server's --activity-staleness")] : []),
          h("td", { title: t.lease_owner || "" }, holder ? holder.process_kind + " " + short(t.lease_owner) : short(t.lease_owner)),
          h("td", { class: "num" }, t.lease_epoch),
          h("td", {}, ago(t.started_at)), h("td", {}, ago(t.last_heartbeat_at)),
          h("td", {}, t.heartbeat_schema_version >= 2 ? ago(t.last_activity_at) : h("span", { class: "muted", title: "v1 heartbeats carry no activity" }, "n/a")),
          h("td", {}, expiry(t.lease_expires_at)),
          h("td", { class: "num" }, t.attempts + "/" + t.max_attempts));
      })));
  }

  function renderEvents(evs) {
    if (!evs.length) return fill("card-events", empty("no process events"));
    fill("card-events", table(["when", "agent", "kind", "exit", "ran", "delivery", "stderr"], evs.map((e) =>
      h("tr", { "data-event": e.event_id, "data-suppressed": e.delivery_kind === "suppressed" },
        h("td", { title: e.at }, ago(e.at)), h("td", {}, e.agent), h("td", {}, badge(e.kind)),
        h("td", {}, e.signal ? e.signal : e.exit_code != null ? "code " + e.exit_code : "—"),
        h("td", {}, dur(e.run_duration_ms)),
        h("td", {}, e.delivery_kind === "suppressed" ? badge("suppressed", "written during a planned stop")
          : e.delivered_at ? h("span", { class: "muted" }, e.delivery_kind || "delivered") : badge("undelivered")),
        h("td", {}, e.stderr_tail ? h("details", {}, h("summary", { class: "small" }, "tail"), h("pre", {}, e.stderr_tail)) : "—")))));
  }

  // ---- polling ----
  async function refresh() {
    const status = document.getElementById("proc-status").value;
    const calls = {
      snapshot: api("/v1/snapshot"),
      processes: api("/v1/processes?limit=1000" + (status ? "&status=" + status : "")),
      tasks: api("/v1/tasks?status=running&limit=1000"),
      events: api("/v1/events?limit=100"),
      sweepers: api("/v1/sweepers"),
    };
    const wantTimeline = Date.now() - state.timelineAt > timelineEveryS * 1000;
    const tlWindow = document.getElementById("tl-window").value;
    if (wantTimeline) calls.timeline = api("/v1/timeline" + (tlWindow === "auto" ? "" : "?window_s=" + tlWindow));
    const names = Object.keys(calls);
    const results = await Promise.allSettled(Object.values(calls));
    const got = {}, errs = {};
    names.forEach((n, i) => (results[i].status === "fulfilled" ? (got[n] = results[i].value) : (errs[n] = results[i].reason)));

    if (got.snapshot) state.offsetMs = ms(got.snapshot.taken_at) - Date.now();
    if (got.timeline) {
      state.timeline = got.timeline;
      state.timelineAt = Date.now();
      const [from, to] = stripRange(got.timeline);
      document.getElementById("window").textContent = dur(to - from);
    }
    const d = state.data;
    d.snapshot = got.snapshot; d.tasks = got.tasks && got.tasks.tasks; d.events = got.events && got.events.events;
    d.processes = got.processes && got.processes.processes;
    d.processesTruncated = !!(got.processes && got.processes.next_cursor);

    got.sweepers ? renderSweepers(got.sweepers.sweepers) : cardError("card-sweepers", errs.sweepers);
    got.snapshot ? renderAgents(got.snapshot) : cardError("card-agents", errs.snapshot);
    d.processes ? renderProcesses(d.processes, d.processesTruncated) : cardError("card-processes", errs.processes);
    const byId = new Map((d.processes || []).map((p) => [p.instance_id, p]));
    d.tasks ? renderTasks(d.tasks, byId) : cardError("card-tasks", errs.tasks);
    d.events ? renderEvents(d.events) : cardError("card-events", errs.events);
    renderSummary(d);

    const failed = Object.values(errs);
    const conn = document.getElementById("conn");
    const banner = document.getElementById("error");
    const unauthorized = failed.some((e) => e.status === 401);
    if (unauthorized) {
      banner.hidden = false;
      banner.textContent = (token ? "The server refused this tab's bearer token." : "This server needs its bearer token.") +
        " Open " + location.origin + "/#token=<token> (a read token is enough: one of the server's --read-token-file).";
    } else if (!intervalOK) {
      banner.hidden = false;
      banner.textContent = "?interval=" + intervalRaw + " is not a number of seconds between " + intervalMin + " and " + intervalMax +
        "; polling every " + intervalDefault + " s instead.";
    } else if (failed.length === names.length) {
      banner.hidden = false;
      banner.textContent = "Cannot reach the server: " + failed[0].message + ". Retrying every " + dur(intervalS * 1000) + ".";
    } else {
      banner.hidden = true;
    }
    const connState = unauthorized ? "unauthorized" : failed.length ? (failed.length === names.length ? "offline" : "partial") : "live";
    conn.dataset.state = connState === "offline" ? "down" : connState;
    conn.textContent = connState;
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
    state.refreshes++;
    document.body.dataset.refreshes = state.refreshes;
  }

  async function loop() {
    if (!state.paused) {
      try { await refresh(); } catch (e) { console.error(e); }
    }
    setTimeout(loop, intervalS * 1000);
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.getElementById("interval").textContent = dur(intervalS * 1000);
    const pause = document.getElementById("pause");
    pause.addEventListener("click", () => {
      state.paused = !state.paused;
      pause.textContent = state.paused ? "resume" : "pause";
      document.getElementById("conn").dataset.state = state.paused ? "paused" : "live";
      document.getElementById("conn").textContent = state.paused ? "paused" : "live";
    });
    document.getElementById("proc-filter").addEventListener("input", () => state.data.processes && renderProcesses(state.data.processes, state.data.processesTruncated));
    document.getElementById("proc-status").addEventListener("change", () => refresh());
    document.getElementById("tl-window").addEventListener("change", () => { state.timelineAt = 0; refresh(); });
    loop();
  });
})();
