// turnlog inspector: plain JavaScript, no dependencies, no build step.
// Two pages on one document: /ui/ (chats and turns) and /ui/turns/{id} (one turn).
"use strict";

const KEY_STORE = "turnlog.key";
const PAGE = 25;
const TIMELINE_PAGE = 200;
const STATUSES = ["running", "completed", "cancelled", "failed", "interrupted"];

// ---------------------------------------------------------------- helpers

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "class") el.className = value;
    else if (name === "text") el.textContent = value;
    else el.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function fmtTime(ts) {
  if (ts === null || ts === undefined) return "";
  const d = new Date(ts * 1000);
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

function fmtClock(ts) {
  const d = new Date(ts * 1000);
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

function fmtMs(ms) {
  if (ms === null || ms === undefined) return "—";
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(2)} s`;
}

function pretty(value) {
  if (value === null || value === undefined) return "";
  if (typeof value === "string") {
    try {
      const parsed = JSON.parse(value);
      if (parsed !== null && typeof parsed === "object") return JSON.stringify(parsed, null, 2);
    } catch (_) { /* plain text */ }
    return value;
  }
  return JSON.stringify(value, null, 2);
}

function messageText(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content.map((part) => {
      if (part.type === "text" || part.type === "input_text" || part.type === "output_text") return part.text;
      if (part.type === "image_url") return `[image: ${(part.image_url && part.image_url.url || "").slice(0, 80)}]`;
      return `[${part.type}]`;
    }).join("\n");
  }
  return pretty(content);
}

function clip(text, n) {
  if (!text) return "";
  return text.length > n ? text.slice(0, n - 1) + "…" : text;
}

function fill(el, ...children) {
  el.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false && c !== ""));
}

// Links only to web pages and turnlog's own paths (never javascript: and the like).
function safeUrl(url) {
  if (typeof url !== "string") return null;
  if (/^https?:\/\//i.test(url) || /^\/v1\//.test(url)) return url;
  return null;
}

function badge(status) {
  return h("span", { class: `badge s-${status}` }, status);
}

function announce(text) {
  const el = document.getElementById("announce");
  el.textContent = "";
  window.setTimeout(() => { el.textContent = text; }, 30);
}

function main() { return document.getElementById("main"); }

function setMain(...children) {
  const m = main();
  fill(m, ...children);
}

// ---------------------------------------------------------------- the API, with the key

class AuthNeeded extends Error {}

function storedKey() {
  try { return sessionStorage.getItem(KEY_STORE); } catch (_) { return null; }
}

async function api(path, options = {}) {
  const headers = Object.assign({}, options.headers || {});
  const key = storedKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  const response = await fetch(path, Object.assign({}, options, { headers }));
  if (response.status === 401) {
    const body = await response.json().catch(() => ({}));
    askForKey(key ? "That key was not accepted. Enter another." : null, body);
    throw new AuthNeeded("authentication needed");
  }
  return response;
}

async function apiJson(path, options) {
  const response = await api(path, options);
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    const message = body && body.error ? body.error.message : `HTTP ${response.status}`;
    const err = new Error(message);
    err.status = response.status;
    throw err;
  }
  return body;
}

function askForKey(problem) {
  stopFollowing();
  document.getElementById("forget-key").hidden = true;
  const input = h("input", { id: "key-input", type: "password", name: "key", autocomplete: "off", required: true, "aria-describedby": "key-help" });
  const form = h("form", { class: "card key-form", id: "key-form", onsubmit: (ev) => {
    ev.preventDefault();
    const value = input.value.trim();
    if (!value) return;
    try { sessionStorage.setItem(KEY_STORE, value); } catch (_) { /* private mode */ }
    route();
  } },
  h("h1", {}, "An API key is needed"),
  h("p", { id: "key-help" }, "This turnlog requires a key (",
    h("code", {}, "turnlog keys create --user NAME"),
    "). You will see only that user's chats and turns. The key stays in this tab (session storage) and is sent only to this server."),
  problem ? h("p", { class: "alert error", role: "alert" }, problem) : null,
  h("label", { for: "key-input" }, "API key"),
  h("div", { class: "row" }, input, h("button", { type: "submit" }, "Use key")));
  setMain(form);
  document.title = "API key needed · turnlog inspector";
  input.focus();
}

function showError(where, err) {
  if (err instanceof AuthNeeded) return;
  fill(where, h("p", { class: "alert error", role: "alert" }, `Could not load: ${err.message}`));
}

// ---------------------------------------------------------------- routing

function route() {
  stopFollowing();
  document.getElementById("forget-key").hidden = !storedKey();
  const match = location.pathname.match(/^\/ui\/turns\/([^/]+)\/?$/);
  if (match) turnPage(decodeURIComponent(match[1]));
  else listPage();
}

// ---------------------------------------------------------------- list page

async function listPage() {
  const params = new URLSearchParams(location.search);
  const state = {
    q: params.get("q") || "",
    status: params.get("status") || "",
    model: params.get("model") || "",
    since: params.get("since") || "",
    until: params.get("until") || "",
    tools: params.get("tools") === "true",
    failed: params.get("failed") === "true",
    chat: params.get("chat") || "",
    chatTitle: "",
    cursors: [], // the `before` of each page shown before this one (keyset pages)
    before: "",
  };
  document.title = "Chats and turns · turnlog inspector";
  const turnsBox = h("div", { id: "turns-box" }, h("p", { class: "loading" }, "Loading turns…"));
  const chatsBox = h("div", { id: "chats-box" }, h("p", { class: "loading" }, "Loading chats…"));
  const countsBox = h("p", { id: "turn-counts", class: "muted", "aria-live": "polite" });
  const search = h("input", { id: "f-q", name: "q", type: "search", value: state.q, placeholder: "words in a question or an answer" });
  const statusSel = h("select", { id: "f-status", name: "status" },
    h("option", { value: "" }, "any"), STATUSES.map((s) => h("option", { value: s, selected: s === state.status }, s)));
  const modelSel = h("select", { id: "f-model", name: "model" }, h("option", { value: "" }, "any"),
    state.model ? h("option", { value: state.model, selected: true }, state.model) : null);
  const since = h("input", { id: "f-since", name: "since", type: "date", value: state.since });
  const until = h("input", { id: "f-until", name: "until", type: "date", value: state.until });
  const tools = h("input", { id: "f-tools", name: "tools", type: "checkbox", checked: state.tools });
  const failed = h("input", { id: "f-failed", name: "failed", type: "checkbox", checked: state.failed });
  const chatNote = h("span", { id: "f-chat" });
  const restart = () => {
    state.cursors = [];
    state.before = "";
    sync();
    loadTurns();
    loadCounts();
  };
  const apply = () => {
    state.q = search.value.trim();
    state.status = statusSel.value;
    state.model = modelSel.value;
    state.since = since.value;
    state.until = until.value;
    state.tools = tools.checked;
    state.failed = failed.checked;
    restart();
  };
  for (const control of [statusSel, modelSel, since, until, tools, failed]) control.addEventListener("change", apply);

  function filters() {
    const q = new URLSearchParams();
    if (state.q) q.set("q", state.q);
    if (state.status) q.set("status", state.status);
    if (state.model) q.set("model", state.model);
    if (state.since) q.set("since", state.since);
    // the last day chosen is included: until is the start of the day after it
    if (state.until) q.set("until", new Date(Date.parse(state.until + "T00:00:00Z") + 86400000).toISOString().slice(0, 10));
    if (state.tools) q.set("tools", "true");
    if (state.failed) q.set("failed", "true");
    if (state.chat) q.set("chat_id", state.chat);
    return q;
  }

  function sync() {
    const q = new URLSearchParams();
    for (const name of ["q", "status", "model", "since", "until", "chat"]) if (state[name]) q.set(name, state[name]);
    if (state.tools) q.set("tools", "true");
    if (state.failed) q.set("failed", "true");
    const qs = q.toString();
    history.replaceState(null, "", `/ui/${qs ? "?" + qs : ""}`);
    fill(chatNote, state.chat ? h("span", { class: "chip" }, `chat ${state.chatTitle || state.chat} `,
      h("button", { type: "button", class: "link", "aria-label": "Show turns of all chats", onclick: () => { state.chat = ""; restart(); } }, "× all chats")) : "");
  }

  function showChat(id, title) {
    state.chat = id;
    state.chatTitle = title || "";
    restart();
  }

  // Each filter change asks again; an answer that arrives after a newer
  // question's is dropped, or a slow one would show the old filters' turns.
  let turnsAsked = 0;
  let countsAsked = 0;

  async function loadTurns() {
    const asked = ++turnsAsked;
    const q = filters();
    q.set("limit", String(PAGE));
    if (state.before) q.set("before", state.before);
    turnsBox.setAttribute("aria-busy", "true");
    try {
      const body = await apiJson(`/v1/turns?${q}`);
      if (asked === turnsAsked) renderTurns(body);
    } catch (err) {
      if (asked === turnsAsked) showError(turnsBox, err);
    } finally {
      if (asked === turnsAsked) turnsBox.removeAttribute("aria-busy");
    }
  }

  async function loadCounts() {
    const asked = ++countsAsked;
    try {
      const body = await apiJson(`/v1/ui/turns/counts?${filters()}`);
      if (asked !== countsAsked) return;
      const current = modelSel.value;
      fill(modelSel, h("option", { value: "" }, "any"),
        ...body.models.map((m) => h("option", { value: m, selected: m === current }, m)));
      const parts = Object.entries(body.by_status).sort((a, b) => b[1] - a[1]).map(([s, n]) => `${n} ${s}`);
      fill(countsBox, `${body.total} ${body.total === 1 ? "turn" : "turns"}${parts.length ? ": " + parts.join(", ") : ""}`);
    } catch (err) {
      if (asked === countsAsked) fill(countsBox, "");
    }
  }

  function turnName(t) {
    return clip(t.title || t.first_message, 120) || "(no message)";
  }

  function renderTurns(body) {
    const rows = body.data.map((t) => h("tr", { class: "turn-row" },
      h("td", { "data-label": "Turn" },
        h("a", { href: `/ui/turns/${encodeURIComponent(t.id)}`, class: "turn-link", title: t.first_message || "" }, turnName(t)),
        t.used_tools ? h("span", { class: "chip tools-chip" }, "tools") : null,
        h("br"), h("code", { class: "muted" }, t.id)),
      h("td", { "data-label": "Status" }, badge(t.status)),
      h("td", { "data-label": "Model" }, t.model),
      h("td", { "data-label": "Started" }, fmtTime(t.created_at)),
      h("td", { "data-label": "Chat" }, h("button", { type: "button", class: "link", title: t.chat_id,
        onclick: () => showChat(t.chat_id, t.chat_title) }, t.chat_title || t.chat_id))));
    const table = rows.length ? h("table", { class: "turns", id: "turns-table" },
      h("caption", { class: "sr-only" }, "Turns, newest first"),
      h("thead", {}, h("tr", {}, ["Turn", "Status", "Model", "Started", "Chat"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, rows)) : h("p", { class: "empty" }, "No turns match.");
    const pager = h("nav", { class: "pager", "aria-label": "Turn pages" },
      h("button", { type: "button", disabled: !state.cursors.length, onclick: () => { state.before = state.cursors.pop(); loadTurns(); } }, "← Newer"),
      h("span", {}, `Page ${state.cursors.length + 1}`),
      h("button", { type: "button", disabled: !body.next_before, onclick: () => { state.cursors.push(state.before); state.before = body.next_before; loadTurns(); } }, "Older →"));
    fill(turnsBox, table, pager);
  }

  let chatsBefore = [];
  async function loadChats(before) {
    const q = new URLSearchParams({ limit: String(PAGE) });
    if (before) q.set("before", String(before));
    try {
      const body = await apiJson(`/v1/ui/chats?${q}`);
      const items = body.data.map((c) => h("li", {},
        h("button", { type: "button", class: "link chat-link", title: c.id, onclick: () => { showChat(c.id, c.title || c.first_message); document.getElementById("turns-h").focus(); } },
          c.title || clip(c.first_message, 80) || "Untitled chat"),
        h("span", { class: "muted" }, ` · ${fmtTime(c.updated_at)}`),
        c.tags && c.tags.length ? h("span", { class: "muted" }, ` · ${c.tags.join(", ")}`) : null));
      const last = body.data.length ? body.data[body.data.length - 1].updated_at : null;
      fill(chatsBox, items.length ? h("ul", { class: "chats", id: "chats-list" }, items) : h("p", { class: "empty" }, "No chats yet."),
        h("nav", { class: "pager", "aria-label": "Chat pages" },
          h("button", { type: "button", disabled: !chatsBefore.length, onclick: () => { chatsBefore.pop(); loadChats(chatsBefore[chatsBefore.length - 1]); } }, "← Newer"),
          h("button", { type: "button", disabled: body.data.length < PAGE, onclick: () => { chatsBefore.push(last); loadChats(last); } }, "Older →")));
    } catch (err) {
      showError(chatsBox, err);
    }
  }

  setMain(h("div", { class: "list-layout" },
    h("section", { class: "card", "aria-labelledby": "turns-h" },
      h("h1", { id: "turns-h", tabindex: "-1" }, "Turns"),
      h("form", { class: "filters", role: "search", onsubmit: (ev) => { ev.preventDefault(); apply(); } },
        h("div", { class: "grow" }, h("label", { for: "f-q" }, "Search"), search),
        h("div", {}, h("label", { for: "f-status" }, "Status"), statusSel),
        h("div", {}, h("label", { for: "f-model" }, "Model"), modelSel),
        h("div", {}, h("label", { for: "f-since" }, "From"), since),
        h("div", {}, h("label", { for: "f-until" }, "To"), until),
        h("div", { class: "check" }, tools, h("label", { for: "f-tools" }, "Used tools")),
        h("div", { class: "check" }, failed, h("label", { for: "f-failed" }, "Failed")),
        h("div", {}, h("button", { type: "submit", id: "f-go" }, "Search")),
        chatNote),
      countsBox,
      turnsBox),
    h("section", { class: "card", "aria-labelledby": "chats-h" }, h("h2", { id: "chats-h" }, "Chats"), chatsBox)));
  sync();
  await Promise.all([loadTurns(), loadCounts(), loadChats(null)]);
}

// ---------------------------------------------------------------- the conversation

// One assistant message's output items as its user saw them: the text, and
// each tool call folded with its result.
function renderOutput(items) {
  const results = new Map(items.filter((i) => i.type === "function_call_output").map((i) => [i.call_id, i.output]));
  return items.filter((i) => i.type !== "function_call_output").map((item) => {
    if (item.type === "message") {
      return h("p", { class: "chat-text" }, (item.content || []).map((p) => p.text || "").join(""));
    }
    if (item.type === "function_call") {
      const result = results.has(item.call_id) ? results.get(item.call_id) : null;
      return h("details", { class: "chat-fold" }, h("summary", {}, `Tool call: ${item.name}`, item.status && item.status !== "completed" ? ` (${item.status})` : ""),
        h("div", { class: "kv" }, h("span", { class: "k" }, "Arguments"), h("pre", {}, pretty(item.arguments))),
        h("div", { class: "kv" }, h("span", { class: "k" }, "Result"), h("pre", {}, result === null ? "(no result)" : pretty(result))));
    }
    if (item.type === "reasoning") {
      return h("details", { class: "chat-fold" }, h("summary", {}, "Reasoning"), h("pre", {}, messageText(item.content || item.summary || "")));
    }
    if (item.type === "code_interpreter") {
      return h("details", { class: "chat-fold" }, h("summary", {}, `Code (${item.status || ""})`), h("pre", {}, item.code || ""), h("pre", {}, pretty(item.output)));
    }
    return h("p", { class: "muted" }, `[${item.type}]`);
  });
}

function renderChat(messages, turnId, sources) {
  if (!messages.length) return h("p", { class: "empty" }, "No messages.");
  return h("ol", { class: "chat", id: "chat-list" }, messages.map((m) => {
    const current = m.turn_id === turnId;
    const head = h("div", { class: "msg-head" }, h("strong", {}, m.role),
      m.turn_id && !current ? h("span", { class: "muted" }, " · ", h("a", { href: `/ui/turns/${encodeURIComponent(m.turn_id)}` }, "its turn")) : null,
      current ? h("span", { class: "chip" }, "this turn") : null,
      m.status && m.status !== "completed" ? h("span", {}, " ", badge(m.status)) : null);
    const body = m.role === "assistant" && Array.isArray(m.output) && m.output.length ? renderOutput(m.output) : [h("p", { class: "chat-text" }, messageText(m.content))];
    const cited = current && sources.length ? h("details", { class: "chat-fold" }, h("summary", {}, `Sources (${sources.length})`),
      h("ol", { class: "sources" }, sources.map((src) => h("li", {}, `[${src.id}] ${src.name || src.url || ""}`)))) : null;
    return h("li", { class: `chat-msg role-${m.role}${current ? " current" : ""}`, "data-role": m.role }, head, ...body, cited);
  }));
}

// ---------------------------------------------------------------- a fork beside its parent

function toolOutputs(view) {
  const names = new Map((view.output || []).filter((i) => i.type === "function_call").map((i) => [i.call_id, i.name]));
  return new Map((view.output || []).filter((i) => i.type === "function_call_output").map((i) => [i.call_id, { name: names.get(i.call_id) || i.call_id, output: i.output }]));
}

function renderFork(parent, fork, forked) {
  const given = Object.keys(forked.tool_results || {});
  const rows = [["Model", parent.model, fork.model]];
  const before = toolOutputs(parent);
  const after = toolOutputs(fork);
  for (const id of new Set([...before.keys(), ...after.keys()])) {
    const name = (after.get(id) || before.get(id)).name;
    rows.push([`${name} result (${id})${given.includes(id) ? ", given" : ""}`, (before.get(id) || {}).output, (after.get(id) || {}).output]);
  }
  rows.push(["Answer", parent.content, fork.content]);
  const cell = (value) => h("td", {}, value === undefined || value === null ? h("span", { class: "muted" }, "(none)") : h("pre", {}, pretty(value)));
  return [
    h("p", {}, "Forked from turn ", h("a", { href: `/ui/turns/${encodeURIComponent(parent.id)}`, id: "fork-parent" }, h("code", {}, parent.id)),
      ` at its seq ${forked.at ?? fork.forked_at}`, forked.model ? `, with model ${forked.model}` : "",
      given.length ? `, given the results of ${given.join(", ")}` : "", ". Everything before that point is the parent's, copied."),
    h("table", { class: "fork-cmp", id: "fork-table" },
      h("caption", { class: "sr-only" }, "The parent and this fork side by side"),
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, ""), h("th", { scope: "col" }, "Parent"), h("th", { scope: "col" }, "This fork"))),
      h("tbody", {}, rows.map(([name, a, b]) => {
        const differs = JSON.stringify(a ?? null) !== JSON.stringify(b ?? null);
        return h("tr", { class: differs ? "differs" : "same" },
          h("th", { scope: "row" }, name, " ", differs ? h("span", { class: "badge s-cancelled" }, "differs") : h("span", { class: "muted" }, "same")),
          cell(a), cell(b));
      }))),
  ];
}

// ---------------------------------------------------------------- turn page

let follower = null; // the live stream of the turn shown, while it runs

function stopFollowing() {
  if (follower) {
    follower.abort();
    follower = null;
  }
}

async function turnPage(turnId) {
  document.title = `Turn ${turnId} · turnlog inspector`;
  const t = {
    id: turnId,
    summary: null,
    page: null, // {after, events, has_more}
    followNewest: false,
    replayTimer: null,
    replayAbort: null,
    refreshing: false,
    dirty: false,
  };
  const q = (sel) => main().querySelector(sel);

  const slider = h("input", { type: "range", id: "replay-seq", min: "1", max: "1", value: "1", step: "1", "aria-describedby": "replay-where" });
  const layout = h("div", { class: "turn-layout" },
    h("section", { class: "card head", id: "turn-head", "aria-labelledby": "turn-h" },
      h("p", { class: "crumbs" }, h("a", { href: "/ui/" }, "← Chats and turns")),
      h("h1", { id: "turn-h" }, "Turn ", h("code", {}, turnId)),
      h("div", { id: "turn-facts" }, h("p", { class: "loading" }, "Loading…")),
      h("div", { class: "row actions" },
        h("button", { type: "button", id: "cancel-btn", class: "danger", hidden: true, onclick: () => cancelTurn() }, "Cancel turn"),
        h("span", { id: "live", class: "live", role: "status" })),
      h("div", { id: "problems" })),
    h("section", { class: "card", id: "fork", "aria-labelledby": "fork-h", hidden: true },
      h("h2", { id: "fork-h" }, "Forks"),
      h("div", { id: "fork-cmp" }),
      h("div", { id: "fork-list" })),
    h("section", { class: "card", id: "shape", "aria-labelledby": "shape-h" },
      h("h2", { id: "shape-h" }, "Shape"),
      h("p", { class: "muted" }, "The turn on one time axis: assembly, model calls (the lighter part: waiting for the first chunk), tool calls, approval waits, reinjections, outlet and background tasks. Hover a bar for its figures; choose one to open its event."),
      h("div", { id: "spans" }, h("p", { class: "loading" }, "Loading…"))),
    h("div", { class: "cols" },
      h("div", { class: "col" },
        h("section", { class: "card", "aria-labelledby": "answer-h" }, h("h2", { id: "answer-h" }, "Answer"),
          h("div", { id: "answer" })),
        h("section", { class: "card", "aria-labelledby": "chat-h" }, h("h2", { id: "chat-h" }, "Conversation"),
          h("p", { class: "muted" }, "The chat as its user saw it, up to now; tool calls and sources folded."),
          h("div", { id: "chat-view" }, h("p", { class: "loading" }, "Loading…"))),
        h("section", { class: "card", "aria-labelledby": "tools-h" }, h("h2", { id: "tools-h" }, "Tool calls"), h("div", { id: "tools" })),
        h("section", { class: "card", "aria-labelledby": "sources-h" }, h("h2", { id: "sources-h" }, "Sources and citations"), h("div", { id: "sources" })),
        h("section", { class: "card", "aria-labelledby": "requests-h" }, h("h2", { id: "requests-h" }, "Model requests"),
          h("p", { class: "muted" }, "The messages each model call was sent, as assembled: system prompt, chat history, sources, tool results."),
          h("div", { id: "requests" }))),
      h("div", { class: "col side" },
        h("section", { class: "card", "aria-labelledby": "replay-h" }, h("h2", { id: "replay-h" }, "Replay"),
          h("p", { class: "muted" }, "The turn as it was right after an event (", h("code", {}, "GET /v1/turns/{id}/replay"), ")."),
          h("label", { for: "replay-seq" }, "Event seq: ", h("output", { id: "replay-out", for: "replay-seq" }, "1")),
          h("div", { class: "row slider-row" },
            h("button", { type: "button", class: "small", "aria-label": "Previous event", onclick: () => stepReplay(-1) }, "◀"),
            slider,
            h("button", { type: "button", class: "small", "aria-label": "Next event", onclick: () => stepReplay(1) }, "▶")),
          h("p", { id: "replay-where", class: "muted" }),
          h("pre", { id: "replay-text", class: "answer-text", tabindex: "0", "aria-label": "Answer at this event" })),
        h("section", { class: "card", "aria-labelledby": "verify-h" }, h("h2", { id: "verify-h" }, "Verify"),
          h("p", { class: "muted" }, "Re-runs the engine against the results recorded in the log (model replies, tool results) and checks it writes the same events. ",
            "It proves the log is consistent with turnlog's own logic; it does not prove the model or the tools told the truth."),
          h("button", { type: "button", id: "verify-btn", onclick: () => loadVerify() }, "Verify this turn"),
          h("div", { id: "verify", "aria-live": "polite" })),
        h("section", { class: "card", "aria-labelledby": "receipt-h" }, h("h2", { id: "receipt-h" }, "Receipt"),
          h("p", { class: "muted" }, "A hash over the whole log, event by event. Keep it: any later change to this turn's events (edited, added, removed) no longer matches it. ",
            "A signature, when present, also proves this server issued it."),
          h("button", { type: "button", id: "receipt-btn", onclick: () => loadReceipt() }, "Get the receipt"),
          h("div", { id: "receipt", "aria-live": "polite" })))),
    h("section", { class: "card", "aria-labelledby": "timeline-h" },
      h("h2", { id: "timeline-h" }, "Timeline"),
      h("p", { class: "muted" }, "Each event with its seq, time, type and the state the turn was in after it. Open a row for its details."),
      h("div", { class: "row timeline-nav", id: "timeline-nav" }),
      h("ol", { id: "timeline", class: "timeline", "aria-labelledby": "timeline-h" })));
  setMain(layout);
  slider.addEventListener("input", () => scheduleReplay());

  // -- loading

  async function loadSummary() {
    t.summary = await apiJson(`/v1/ui/turns/${encodeURIComponent(turnId)}/summary`);
    renderSummary();
  }

  // Pages asked for in a row (a click, then another, or a live refresh) may be
  // answered out of order: only the latest question's answer is shown.
  let pageAsked = 0;
  async function loadPage(after) {
    const asked = ++pageAsked;
    const body = await apiJson(`/v1/ui/turns/${encodeURIComponent(turnId)}/timeline?after=${after}&limit=${TIMELINE_PAGE}`);
    if (asked !== pageAsked) return;
    t.page = { after, events: body.events, has_more: body.has_more };
    renderTimeline();
  }

  function lastPageStart(lastSeq) {
    return Math.max(0, Math.floor((Math.max(lastSeq, 1) - 1) / TIMELINE_PAGE) * TIMELINE_PAGE);
  }

  async function loadSpans() {
    const data = await apiJson(`/v1/turns/${encodeURIComponent(turnId)}/spans`);
    TurnlogSpans.render(q("#spans"), data, (seq) => jumpTo(seq));
  }

  // The first page of the timeline (cheap to serve) paints first, the spans
  // beside it; then the summary (a fold of the whole log, slower on a long
  // turn) fills the rest.
  const spansShown = loadSpans().then(() => performance.mark("turnlog:spans"), (err) => { if (err.status !== 404) showError(q("#spans"), err); });
  try {
    await loadPage(0);
    performance.mark("turnlog:timeline");
  } catch (err) {
    if (err.status !== 404) showError(q("#timeline"), err);
  }

  try {
    t.summary = await apiJson(`/v1/ui/turns/${encodeURIComponent(turnId)}/summary`);
  } catch (err) {
    if (err.status === 404) {
      setMain(h("section", { class: "card" }, h("h1", {}, "Turn not found"),
        h("p", {}, "There is no turn ", h("code", {}, turnId), " for this key."), h("p", {}, h("a", { href: "/ui/" }, "← Chats and turns"))));
      return;
    }
    showError(q("#turn-facts"), err);
    return;
  }
  renderSummary();
  performance.mark("turnlog:summary");
  loadChat();
  if (t.summary.turn.parent_turn_id) loadFork(t.summary.turn);
  loadForks();
  const running = t.summary.turn.status === "running";
  t.followNewest = running;
  slider.max = String(Math.max(1, t.summary.last_seq));
  slider.value = slider.max;
  showReplay(t.summary.last_seq, t.summary.turn, null);
  if (running) {
    await loadPage(lastPageStart(t.summary.last_seq)).catch((err) => showError(q("#timeline"), err));
    follow();
  } else if (t.page) {
    renderTimeline();
  }

  async function loadChat() {
    const box = q("#chat-view");
    try {
      const chat = await apiJson(`/v1/chats/${encodeURIComponent(t.summary.turn.chat_id)}`);
      fill(box, renderChat(chat.messages, turnId, t.summary.turn.sources || []));
    } catch (err) {
      showError(box, err);
    }
  }

  // A fork beside its parent: what it was given, and what came out differently.
  async function loadFork(v) {
    const box = q("#fork-cmp");
    q("#fork").hidden = false;
    try {
      const [parent, first] = await Promise.all([
        apiJson(`/v1/turns/${encodeURIComponent(v.parent_turn_id)}`),
        apiJson(`/v1/turns/${encodeURIComponent(turnId)}/events?after=0&limit=1`),
      ]);
      const forked = (first.events[0] || {}).data || {};
      fill(box, renderFork(parent, v, forked));
    } catch (err) {
      showError(box, err);
    }
  }

  // This turn's own forks: each opens beside this turn on its page.
  async function loadForks() {
    try {
      const body = await apiJson(`/v1/ui/turns/${encodeURIComponent(turnId)}/forks`);
      if (!body.data.length) return;
      q("#fork").hidden = false;
      fill(q("#fork-list"), h("h3", {}, `Forked ${body.data.length === 1 ? "once" : `${body.data.length} times`}`),
        h("ul", { class: "forks", id: "forks-of" }, body.data.map((f) => h("li", {},
          h("a", { href: `/ui/turns/${encodeURIComponent(f.turn_id)}` }, h("code", {}, f.turn_id)),
          ` at seq ${f.at} · ${f.model} · `, badge(f.status), h("span", { class: "muted" }, ` · ${fmtTime(f.created_at)}`)))));
    } catch (err) {
      showError(q("#fork-list"), err);
    }
  }

  // -- the summary: facts, answer, tools, sources, requests

  function renderSummary() {
    const s = t.summary;
    const v = s.turn;
    const usage = v.usage ? `${v.usage.prompt_tokens ?? v.usage.input_tokens ?? "?"} in / ${v.usage.completion_tokens ?? v.usage.output_tokens ?? "?"} out` : "—";
    fill(q("#turn-facts"), h("dl", { class: "facts" },
      fact("Status", badge(v.status)),
      fact("State", h("span", { id: "turn-state" }, v.state)),
      fact("Model", v.model),
      fact("Chat", h("a", { href: `/ui/?chat=${encodeURIComponent(v.chat_id)}` }, v.title || v.chat_id)),
      fact("Iterations", h("span", { id: "iterations" }, String(s.iterations))),
      fact("Events", h("span", { id: "event-count" }, String(s.last_seq))),
      fact("Started", fmtTime(v.created_at)),
      fact("Updated", fmtTime(v.updated_at)),
      fact("Finish", v.finish_reason || "—"),
      fact("Tokens", usage)));
    const cancel = q("#cancel-btn");
    cancel.hidden = v.status !== "running";
    q("#turn-head").dataset.status = v.status;

    const problems = [];
    if (v.error) problems.push({ level: "error", message: `${v.error.type || "error"}: ${v.error.message || ""}`, seq: null });
    for (const p of s.problems) if (!(v.error && p.type === "turn.failed")) problems.push(p);
    for (const w of v.warnings || []) problems.push({ level: "warning", message: w, seq: null });
    fill(q("#problems"), problems.length ? h("ul", { class: "problems", id: "problem-list", "aria-label": "Failures and warnings" },
      problems.map((p) => h("li", { class: `alert ${p.level}` }, h("strong", {}, p.level === "error" ? "Failure" : "Warning"), " ",
        p.seq ? h("button", { type: "button", class: "link", onclick: () => jumpTo(p.seq) }, `seq ${p.seq}`) : null, p.seq ? ": " : "", p.message))) : "");

    fill(q("#answer"),
      v.content ? h("pre", { class: "answer-text", id: "answer-text", tabindex: "0" }, v.content)
        : h("p", { class: "empty", id: "answer-text" }, v.status === "running" ? "No answer text yet." : "No answer text."),
      v.reasoning_content ? h("details", {}, h("summary", {}, "Reasoning"), h("pre", { class: "answer-text" }, v.reasoning_content)) : null,
      v.follow_ups && v.follow_ups.length ? h("p", { class: "muted" }, `Follow-ups: ${v.follow_ups.join(" · ")}`) : null);

    fill(q("#tools"), s.tools.length ? h("ol", { class: "tools", id: "tool-list" }, s.tools.map((c) => h("li", { class: `tool s-${c.status}` },
      h("div", { class: "tool-head" }, h("strong", {}, c.name), " ", badge(c.status),
        h("span", { class: "muted" }, ` · round ${c.iteration} · ${fmtMs(c.duration_ms)} · ${c.kind || ""} · `),
        h("button", { type: "button", class: "link", onclick: () => jumpTo(c.started_seq) }, `seq ${c.started_seq}`),
        h("code", { class: "muted" }, ` ${c.call_id}`)),
      h("div", { class: "kv" }, h("span", { class: "k" }, "Arguments"), h("pre", { class: "tool-args" }, pretty(c.arguments))),
      h("div", { class: "kv" }, h("span", { class: "k" }, "Result"), h("pre", { class: "tool-result" }, c.output === null ? "(no result yet)" : pretty(c.output))),
      c.error ? h("p", { class: "alert error" }, `Error: ${c.error}`) : null)))
      : h("p", { class: "empty" }, "No tool calls."));

    const sources = v.sources || [];
    fill(q("#sources"), sources.length ? h("ol", { class: "sources" }, sources.map((src) => h("li", {},
      h("strong", {}, `[${src.id}] `), safeUrl(src.url) ? h("a", { href: safeUrl(src.url), rel: "noopener noreferrer" }, src.name || src.url) : (src.name || src.url || ""),
      h("span", { class: "muted" }, ` · ${src.type || ""}`)))) : h("p", { class: "empty" }, "No sources."));

    fill(q("#requests"), s.requests.length ? h("ol", { class: "requests" }, s.requests.map((r) => h("li", {},
      h("details", { id: `request-${r.seq}` }, h("summary", {}, `Call ${r.iteration + 1} · seq ${r.seq} · ${r.messages.length} messages${r.resumed ? " · resumed" : ""}`),
        renderMessages(r.messages, r.history_len, r.prefill))))) : h("p", { class: "empty" }, "No model request yet."));
  }

  function fact(name, value) {
    return h("div", {}, h("dt", {}, name), h("dd", {}, value));
  }

  function renderMessages(messages, historyLen, prefill) {
    return h("div", { class: "messages" }, messages.map((m, i) => {
      const origin = i < historyLen ? "history" : (m.role === "tool" || (m.tool_calls && i >= historyLen) ? "tool round" : "this turn");
      const calls = (m.tool_calls || []).map((c) => `→ ${c.function ? c.function.name : c.name}(${c.function ? c.function.arguments : c.arguments})`).join("\n");
      return h("div", { class: `msg role-${m.role}` },
        h("div", { class: "msg-head" }, h("strong", {}, m.role), h("span", { class: "muted" }, ` · ${origin}${m.tool_call_id ? " · " + m.tool_call_id : ""}`)),
        h("pre", {}, [messageText(m.content), calls].filter(Boolean).join("\n")));
    }), prefill ? h("div", { class: "msg" }, h("div", { class: "msg-head" }, h("strong", {}, "prefill (continued from)")), h("pre", {}, prefill)) : null);
  }

  // -- the timeline: one page of events at a time

  function renderTimeline() {
    const page = t.page;
    const s = t.summary;
    const lastShown = page.events.length ? page.events[page.events.length - 1].seq : 0;
    if (page.after === 0 && page.events.length) t.firstAt = page.events[0].at;
    if (s && s.first_at) t.firstAt = s.first_at;
    const known = Math.max(s ? s.last_seq : 0, lastShown);
    const total = s || !page.has_more ? known : null;
    const pages = total === null ? "…" : Math.max(1, Math.ceil(total / TIMELINE_PAGE));
    const index = Math.floor(page.after / TIMELINE_PAGE);
    const jump = h("input", { type: "number", id: "jump-seq", min: "1", max: total === null ? null : String(total), inputmode: "numeric", size: "6" });
    fill(q("#timeline-nav"),
      h("button", { type: "button", disabled: index === 0, onclick: () => { t.followNewest = false; loadPage(0); } }, "⇤ First"),
      h("button", { type: "button", id: "tl-prev", disabled: index === 0, onclick: () => { t.followNewest = false; loadPage(page.after - TIMELINE_PAGE); } }, "← Earlier"),
      h("span", { id: "tl-where" }, `Events ${page.events.length ? page.events[0].seq : 0}–${page.events.length ? page.events[page.events.length - 1].seq : 0} of ${total === null ? "…" : total} (page ${index + 1} of ${pages})`),
      h("button", { type: "button", id: "tl-next", disabled: !page.has_more, onclick: () => { loadPage(page.after + TIMELINE_PAGE); } }, "Later →"),
      h("button", { type: "button", id: "tl-last", disabled: !page.has_more || total === null, onclick: () => { loadPage(lastPageStart(total)); } }, "Last ⇥"),
      h("form", { class: "row", onsubmit: (ev) => { ev.preventDefault(); const n = parseInt(jump.value, 10); if (n >= 1) jumpTo(n); } },
        h("label", { for: "jump-seq" }, "Go to seq"), jump, h("button", { type: "submit", class: "small" }, "Go")));
    // Drawn again when the summary or a live update arrives: the events the
    // user opened stay open, and the one focused keeps the focus.
    const list = q("#timeline");
    const open = [...list.querySelectorAll("li.ev > details[open]")].map((d) => d.parentElement.dataset.seq);
    const focused = document.activeElement && list.contains(document.activeElement) ? document.activeElement.closest("li.ev") : null;
    fill(list, ...page.events.map((e) => eventRow(e, t.firstAt)));
    for (const seq of open) {
      const row = document.getElementById(`ev-${seq}`);
      if (row) row.querySelector("details").open = true;
    }
    const again = focused && document.getElementById(`ev-${focused.dataset.seq}`);
    if (again) again.querySelector("summary").focus();
  }

  function eventClass(e) {
    const d = e.data || {};
    if (e.type === "turn.failed" || (e.type === "tool.completed" && d.status && d.status !== "completed")) return "ev bad";
    if (e.type === "model.warning" || e.type === "turn.iteration_limit" || e.type === "turn.interrupted" || e.type === "turn.cancelled" || (e.type === "background.result" && d.error)) return "ev warn";
    return "ev";
  }

  function eventGist(e) {
    const d = e.data || {};
    switch (e.type) {
      case "turn.started": return `model ${d.model}, ${((d.request || {}).messages || []).length} message(s)`;
      case "assembly.step": return d.step;
      case "assembly.completed": return `${(d.messages || []).length} messages (${d.history_len || 0} from history)${d.sources ? `, ${d.sources.length} sources` : ""}`;
      case "model.requested": return `call ${(d.iteration || 0) + 1}${d.resumed ? " (resumed)" : ""}`;
      case "model.delta": return `${d.kind === "reasoning" ? "reasoning " : ""}“${(d.text || "").slice(0, 80)}${(d.text || "").length > 80 ? "…" : ""}”`;
      case "model.item": return d.item ? `${d.item.type}${d.item.name ? " " + d.item.name : ""}` : "";
      case "model.completed": return `finish ${d.finish_reason}${d.usage ? `, ${d.usage.total_tokens ?? ""} tokens` : ""}`;
      case "tools.batch": return `${(d.calls || []).map((c) => c.name).join(", ")}${(d.client_calls || []).length ? ` + ${d.client_calls.length} for the client` : ""}`;
      case "tool.started": return `${d.name}(${String(d.arguments || "").slice(0, 80)})`;
      case "tool.completed": return `${d.name} ${d.status}: ${String(d.error || d.output || "").slice(0, 80)}`;
      case "context.reinjected": return `${(d.messages || []).length} messages for round ${d.iteration}`;
      case "turn.failed": return d.message || "";
      case "model.warning": return d.message || "";
      case "background.result": return `${d.task}${d.error ? " failed" : ""}`;
      case "turn.finalized": return `finish ${d.finish_reason}`;
      default: return "";
    }
  }

  function eventRow(e, first) {
    const detail = h("div", { class: "ev-detail" });
    const row = h("li", { class: eventClass(e), id: `ev-${e.seq}`, "data-seq": String(e.seq), "data-type": e.type },
      h("details", { ontoggle: (ev) => { if (ev.target.open && !detail.firstChild) detail.append(...eventDetail(e)); } },
        h("summary", {},
          h("span", { class: "ev-seq" }, `#${e.seq}`),
          h("time", { class: "ev-time", datetime: new Date(e.at * 1000).toISOString(), title: fmtTime(e.at) }, first ? `+${fmtMs((e.at - first) * 1000)}` : fmtClock(e.at)),
          h("span", { class: "ev-type" }, e.type),
          h("span", { class: "ev-state" }, e.state),
          h("span", { class: "ev-gist" }, eventGist(e))),
        detail));
    return row;
  }

  function eventDetail(e) {
    const out = [h("p", { class: "muted" }, `At ${fmtTime(e.at)} (${fmtClock(e.at)}); state after it: ${e.state}.`)];
    if (e.type === "model.requested") {
      const r = (t.summary.requests || []).find((x) => x.seq === e.seq);
      if (r) out.push(h("h3", {}, "Messages sent"), renderMessages(r.messages, r.history_len, r.prefill));
    }
    if (e.type === "assembly.completed" && e.data.messages) {
      out.push(h("h3", {}, "Assembled messages"), renderMessages(e.data.messages, e.data.history_len || 0, null));
    }
    if (e.type === "tool.completed" || e.type === "tool.started") {
      const c = (t.summary.tools || []).find((x) => x.call_id === e.data.call_id);
      if (c) out.push(h("p", {}, `${c.name}: ${c.status}, ${fmtMs(c.duration_ms)}`));
    }
    out.push(h("pre", { class: "json" }, JSON.stringify(e.data, null, 2)));
    return out;
  }

  async function jumpTo(seq) {
    t.followNewest = false;
    const start = Math.floor((seq - 1) / TIMELINE_PAGE) * TIMELINE_PAGE;
    if (!t.page || t.page.after !== start) await loadPage(start);
    const row = document.getElementById(`ev-${seq}`);
    if (row) {
      const details = row.querySelector("details");
      details.open = true;
      row.scrollIntoView({ block: "center" });
      row.querySelector("summary").focus();
    }
  }

  // -- replay

  function stepReplay(delta) {
    const n = Math.min(Number(slider.max), Math.max(1, Number(slider.value) + delta));
    slider.value = String(n);
    scheduleReplay();
  }

  function scheduleReplay() {
    q("#replay-out").textContent = slider.value;
    window.clearTimeout(t.replayTimer);
    t.replayTimer = window.setTimeout(replayNow, 60);
  }

  function showReplay(seq, view, ev) {
    q("#replay-out").textContent = String(seq);
    q("#replay-where").textContent = `After #${seq}${ev ? ` (${ev.type})` : ""}: state ${view.state}, status ${view.status}, ${view.content.length} characters of answer, ${view.output.filter((i) => i.type === "function_call").length} tool call(s).`;
    const text = q("#replay-text");
    text.textContent = view.content || "";
    text.dataset.seq = String(seq);
    main().querySelectorAll(".ev.at").forEach((el) => el.classList.remove("at"));
    const row = document.getElementById(`ev-${seq}`);
    if (row) row.classList.add("at");
  }

  async function replayNow() {
    const seq = Number(slider.value);
    q("#replay-out").textContent = String(seq);
    if (t.replayAbort) t.replayAbort.abort();
    const ctrl = new AbortController();
    t.replayAbort = ctrl;
    try {
      const [view, events] = await Promise.all([
        apiJson(`/v1/turns/${encodeURIComponent(turnId)}/replay?upto=${seq}`, { signal: ctrl.signal }),
        apiJson(`/v1/turns/${encodeURIComponent(turnId)}/events?after=${seq - 1}&limit=1`, { signal: ctrl.signal }),
      ]);
      if (ctrl.signal.aborted) return;
      showReplay(seq, view, events.events[0]);
    } catch (err) {
      if (err.name === "AbortError" || err instanceof AuthNeeded) return;
      q("#replay-where").textContent = `Could not replay: ${err.message}`;
    }
  }

  // -- live: follow the SSE stream, refresh on what arrives

  async function follow() {
    const ctrl = new AbortController();
    follower = ctrl;
    q("#live").textContent = "● Following live";
    q("#live").classList.add("on");
    try {
      const response = await api(`/v1/turns/${encodeURIComponent(turnId)}/stream`, { signal: ctrl.signal, headers: { Accept: "text/event-stream" } });
      if (response.ok && response.body) {
        const reader = response.body.getReader();
        for (;;) {
          const { done } = await reader.read();
          if (done) break;
          refreshSoon();
        }
      }
    } catch (err) {
      if (err.name === "AbortError" || err instanceof AuthNeeded) return;
    }
    if (follower !== ctrl) return;
    follower = null;
    while (t.refreshing) await new Promise((resolve) => window.setTimeout(resolve, 50));
    await refreshSoon();
    q("#live").textContent = `Turn ${t.summary.turn.status}; no longer live.`;
    q("#live").classList.remove("on");
    announce(`The turn is ${t.summary.turn.status}.`);
  }

  async function refreshSoon() {
    if (t.refreshing) { t.dirty = true; return; }
    t.refreshing = true;
    try {
      do {
        t.dirty = false;
        const atEnd = Number(slider.value) >= Number(slider.max);
        await Promise.all([loadSummary(), loadSpans()]);
        const last = t.summary.last_seq;
        slider.max = String(Math.max(1, last));
        if (atEnd) { slider.value = slider.max; showReplay(last, t.summary.turn, null); }
        if (t.followNewest) await loadPage(lastPageStart(last));
        else renderTimeline();
      } while (t.dirty);
    } catch (err) {
      if (!(err instanceof AuthNeeded)) q("#live").textContent = `Refresh failed: ${err.message}`;
    } finally {
      t.refreshing = false;
    }
  }

  async function cancelTurn() {
    const button = q("#cancel-btn");
    button.disabled = true;
    try {
      const response = await api(`/v1/turns/${encodeURIComponent(turnId)}/cancel`, { method: "POST" });
      if (response.status === 409) announce("The turn had already ended.");
      else if (!response.ok) throw new Error(`HTTP ${response.status}`);
      else announce("Turn cancelled.");
      await refreshSoon();
    } catch (err) {
      if (!(err instanceof AuthNeeded)) q("#live").textContent = `Cancel failed: ${err.message}`;
    } finally {
      button.disabled = false;
    }
  }

  // -- verify and receipt (404: this server does not offer them)

  async function loadVerify() {
    const box = q("#verify");
    fill(box, h("p", { class: "loading" }, "Verifying…"));
    try {
      const response = await api(`/v1/turns/${encodeURIComponent(turnId)}/verify`);
      if (response.status === 404 || response.status === 405) {
        fill(box, h("p", { class: "alert neutral", id: "verify-result", "data-state": "unavailable" }, "Not available: this server does not offer verify (", h("code", {}, "turnlog verify TURN"), " does it from the command line)."));
        return;
      }
      const body = await response.json().catch(() => null);
      if (!response.ok || !body) throw new Error(body && body.error ? body.error.message : `HTTP ${response.status}`);
      fill(box, body.ok
        ? h("p", { class: "alert ok", id: "verify-result", "data-state": "ok" }, "✔ Verified: re-running the engine on the recorded results writes exactly this log.")
        : h("div", { id: "verify-result", "data-state": "failed" }, h("p", { class: "alert error" }, "✘ Does not verify: the re-run wrote different events."),
          h("pre", { class: "json" }, (body.diff || []).map((d) => (typeof d === "string" ? d : JSON.stringify(d))).join("\n"))));
    } catch (err) {
      showError(box, err);
    }
  }

  async function loadReceipt() {
    const box = q("#receipt");
    fill(box, h("p", { class: "loading" }, "Loading…"));
    try {
      const response = await api(`/v1/turns/${encodeURIComponent(turnId)}/receipt`);
      if (response.status === 404 || response.status === 405) {
        fill(box, h("p", { class: "alert neutral", id: "receipt-result", "data-state": "unavailable" }, "Not available: this server does not issue receipts."));
        return;
      }
      const body = await response.json().catch(() => null);
      if (!response.ok || !body) throw new Error(body && body.error ? body.error.message : `HTTP ${response.status}`);
      const count = Array.isArray(body.events) ? body.events.length : body.events;
      fill(box, h("div", { id: "receipt-result", "data-state": "ok" },
        h("dl", { class: "facts receipt" },
          fact("Turn", h("code", {}, body.turn_id)),
          fact("Events", String(count)),
          fact("Algorithm", body.algorithm),
          fact("Head", h("code", { class: "hash" }, body.head)),
          fact("Signature", body.signature ? h("code", { class: "hash" }, body.signature) : "none (unsigned)")),
        h("p", { class: "muted" }, body.signature
          ? `This proves the ${count} events of this turn, as they are now, are the ones the server signed.`
          : `This proves integrity only against a copy you keep: the ${count} events hash to this head. Without a signature it does not prove who issued it.`),
        h("details", {}, h("summary", {}, "Raw receipt"), h("pre", { class: "json" }, JSON.stringify(body, null, 2)))));
    } catch (err) {
      showError(box, err);
    }
  }
}

// ---------------------------------------------------------------- start

document.getElementById("forget-key").addEventListener("click", () => {
  try { sessionStorage.removeItem(KEY_STORE); } catch (_) { /* ignore */ }
  askForKey(null);
});
window.addEventListener("popstate", route);
route();
