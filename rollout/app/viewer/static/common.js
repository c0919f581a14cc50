// Shared helpers of the viewer's page: element building, the JSON API, number formats.
// Plain JavaScript, no build step, nothing fetched from the network.
"use strict";

const V = {};

// h("div", {class: "x", onclick: f}, child, "text", ...): an element; text is always set as text,
// never parsed as HTML.
V.h = function (tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
};

const h = V.h;

// GET /api/<path>?params -> parsed JSON; throws an Error with the server's message.
V.api = async function (path, params) {
  const q = new URLSearchParams(params || {}).toString();
  const r = await fetch(`/api/${path}${q ? "?" + q : ""}`, { cache: "no-store" });
  const body = await r.json().catch(() => ({ error: r.statusText }));
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
};

V.fmtReward = (x) => (x === null || x === undefined ? "–" : String(Math.round(x * 1000) / 1000));
V.fmtNum = (x, digits) => (x === null || x === undefined ? "–" : Number(x).toFixed(digits));
V.fmtInt = (x) => (x === null || x === undefined ? "–" : Number(x).toLocaleString("en-US"));

// The statuses that are infrastructure failures (docs/design.md "Statuses"); cancelled is apart.
V.INFRA = new Set(["aborted", "timeout", "policy_error", "env_error", "user_error", "eval_error", "actor_lost"]);
V.statusClass = function (s) {
  if (s === "completed") return "st-ok";
  if (V.INFRA.has(s)) return "st-infra";
  if (s === "cancelled") return "st-cancel";
  return "st-policy";
};

// A two-column table of [key, value] rows.
V.kvTable = function (rows, attrs) {
  return V.h("table", Object.assign({ class: "kv" }, attrs || {}),
    rows.map(([k, v]) => V.h("tr", {}, V.h("th", {}, k), V.h("td", {}, v))));
};

V.episodeHash = (run, id, tab) => `#/episode/${run}/${encodeURIComponent(id)}/${tab || "conversation"}`;
