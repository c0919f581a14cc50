// One episode: the conversation (messages, tool calls and results, reward breakdown, error) and
// the token view (every token coloured by its loss mask, log-prob on hover, /generate calls with
// their weight versions, segments).
"use strict";

// ---- conversation ----------------------------------------------------------------------------

function pretty(jsonText) {
  try { return JSON.stringify(JSON.parse(jsonText), null, 2); } catch (e) { return String(jsonText); }
}

function messageText(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  return JSON.stringify(content, null, 2);  // list-of-parts content
}

function toolCallCard(call, result) {
  const fn = call.function || {};
  const card = h("div", { class: "toolcall" },
    h("div", { class: "callhead" }, h("span", { class: "tag" }, "tool call"), " ", h("b", {}, fn.name || "?"),
      call.id ? h("span", { class: "muted" }, "  " + call.id) : null),
    h("pre", { class: "args" }, pretty(fn.arguments)));
  if (result) {
    card.append(h("div", { class: "result" + (result.error ? " err" : "") },
      h("div", { class: "callhead" }, h("span", { class: "tag" }, result.error ? "tool error" : "result")),
      h("pre", {}, messageText(result.content))));
  } else {
    card.append(h("div", { class: "result muted" }, "no result (the episode ended first)"));
  }
  return card;
}

V.renderConversation = function (ep) {
  const box = h("div", { id: "conversation" });
  const msgs = ep.messages;
  if (!msgs) {
    box.append(h("p", { class: "note" }, "The conversation was not kept (rollout.keep_messages=false): see the token view."));
    return box;
  }
  const results = new Map();
  for (const m of msgs) if (m.role === "tool" && m.tool_call_id) results.set(m.tool_call_id, m);
  const shown = new Set();
  msgs.forEach((m, i) => {
    if (m.role === "system") {
      const text = messageText(m.content);
      box.append(h("details", { class: "msg system", "data-role": "system" },
        h("summary", {}, `System prompt (${V.fmtInt(text.length)} characters)`), h("pre", {}, text)));
      return;
    }
    if (m.role === "tool") {
      if (m.tool_call_id && shown.has(m.tool_call_id)) return;  // shown with its call
      box.append(h("div", { class: "msg tool", "data-role": "tool" }, h("div", { class: "who" }, `tool ${m.name || ""}`),
        h("pre", { class: m.error ? "err" : "" }, messageText(m.content))));
      return;
    }
    const marks = [];
    if (m.format_feedback) marks.push(h("span", { class: "badge warn" }, "loop feedback on a parse error"));
    if (m.finish_reason === "length") marks.push(h("span", { class: "badge warn" }, "cut at max_new_tokens"));
    if (m.parse_error) marks.push(h("span", { class: "badge bad" }, `parse error: ${m.parse_error}`));
    const el = h("div", { class: `msg ${m.role}`, "data-role": m.role, "data-index": i },
      h("div", { class: "who" }, m.role, ...marks));
    if (m.reasoning_content) {
      el.append(h("details", { class: "reasoning" }, h("summary", {}, "reasoning"), h("pre", {}, m.reasoning_content)));
    }
    const text = messageText(m.content);
    if (text) el.append(h("pre", { class: "content" }, text));
    for (const call of m.tool_calls || []) {
      const res = results.get(call.id);
      if (res) shown.add(call.id);
      el.append(toolCallCard(call, res));
    }
    box.append(el);
  });
  return box;
};

function check(x) {
  if (x === true) return h("span", { class: "yes" }, "✓ yes");
  if (x === false) return h("span", { class: "no" }, "✗ no");
  return x === null || x === undefined ? "–" : String(x);
}

V.renderOutcome = function (ep) {
  const meta = ep.metadata || {};
  const box = h("div", { id: "outcome" });
  const info = meta.reward_info;
  const raw = ep.raw_reward === undefined || ep.raw_reward === null ? ep.reward : ep.raw_reward;
  const rows = [["reward", h("b", {}, V.fmtReward(ep.reward))], ["raw reward (tau2's, unshaped)", V.fmtReward(raw)],
    ["status", h("span", { class: V.statusClass(ep.status) }, ep.status)], ["termination", meta.termination_reason || "–"]];
  for (const step of meta.reward_shaping || []) rows.push([`shaped by ${step.shaper}`, V.fmtReward(step.reward)]);
  if (info && typeof info === "object") {
    for (const [k, v] of Object.entries(info.reward_breakdown || {})) rows.push([`breakdown: ${k}`, V.fmtReward(v)]);
    if ("db_match" in info) rows.push(["DB check (db_match)", check(info.db_match)]);
    if ("communicate_met" in info) rows.push(["communicate (communicate_met)", check(info.communicate_met)]);
    if (Array.isArray(info.action_match)) {
      rows.push(["gold actions matched", h("span", {}, `${info.action_match.filter(Boolean).length} of ${info.action_match.length} `,
        ...info.action_match.map((ok) => h("span", { class: ok ? "yes" : "no" }, ok ? "✓" : "✗")))]);
    }
    for (const [k, v] of Object.entries(info)) {
      if (!["reward_breakdown", "db_match", "communicate_met", "action_match"].includes(k)) rows.push([k, JSON.stringify(v)]);
    }
  } else {
    rows.push(["reward breakdown", info === null ? "none (the environment gave none)" : "none (the episode did not reach the reward)"]);
  }
  box.append(h("h3", {}, "Reward"), V.kvTable(rows, { id: "reward" }));
  if ((ep.task_issues || []).length) {
    box.append(h("h3", {}, "The task's open issues"), h("ul", { id: "task-issues" }, ep.task_issues.map((i) =>
      h("li", {}, h("b", {}, i.id), ` (${i.status}): ${i.title}`, i.link ? h("span", { class: "muted" }, `  ${i.link}`) : null))));
  }
  if (meta.error) box.append(h("h3", {}, "Error"), h("pre", { id: "error", class: "err" }, meta.error));
  const t = meta.timings || {};
  if (Object.keys(t).length) {
    box.append(h("h3", {}, "Timings (s)"), V.kvTable(Object.entries(t).map(([k, v]) => [k, V.fmtNum(v, 3)])));
  }
  box.append(h("details", {}, h("summary", {}, "metadata (JSON)"), h("pre", {}, JSON.stringify(meta, null, 2))));
  return box;
};

// ---- characters this browser cannot draw ------------------------------------------------------
// A character no installed font has is drawn as the font's ".notdef" box: DeepSeek-V4's special
// tokens (<｜User｜>: U+FF5C FULLWIDTH VERTICAL LINE) on a machine without CJK fonts, for one. The
// token view shows such a character escaped (\uFF5C), never as a box. Each distinct character is
// drawn once on a canvas in the token view's font and compared, pixel for pixel, with what this
// browser draws for code points no font has (U+0378, unassigned; U+10FFFD, private use): the same
// pixels are the box. Control, format (zero-width, bidi), private-use and unassigned characters
// are escaped whatever the fonts (invisible, or meaningless), and so is any other character that
// draws nothing and is not white space. Without a canvas, a fixed list decides: printable ASCII,
// Latin-1, Latin Extended-A/B, general punctuation and arrows are drawn, the rest escaped.

const GLYPHS = { known: new Map(), probe: undefined };
const ALWAYS_ESCAPED = /^[\p{Cc}\p{Cf}\p{Co}\p{Cn}\p{Cs}]$/u;
const FIXED_DRAWN = /^[\u0020-\u007e\u00a0-\u024f\u2010-\u205e\u2190-\u21ff]$/u;

function glyphProbe() {
  if (GLYPHS.probe !== undefined) return GLYPHS.probe;
  GLYPHS.probe = null;
  try {
    const canvas = document.createElement("canvas");
    canvas.width = canvas.height = 48;
    const ctx = canvas.getContext("2d", { willReadFrequently: true });
    if (!ctx) return null;
    const sample = h("span", { class: "toks" }, "x");
    document.body.append(sample);
    const family = getComputedStyle(sample).fontFamily;
    sample.remove();
    ctx.font = `32px ${family}`;
    ctx.textBaseline = "top";
    const draw = (ch) => {
      ctx.clearRect(0, 0, 48, 48);
      ctx.fillText(ch, 4, 4);
      const rgba = ctx.getImageData(0, 0, 48, 48).data;
      const alpha = new Uint8Array(rgba.length / 4);
      for (let i = 0; i < alpha.length; i++) alpha[i] = rgba[4 * i + 3];
      return alpha;
    };
    const boxes = ["\u0378", "\u{10FFFD}"].map(draw);
    GLYPHS.probe = { draw, boxes };
  } catch (e) {
    GLYPHS.probe = null;  // no canvas: the fixed list decides
  }
  return GLYPHS.probe;
}

function sameAlpha(a, b) {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

// Whether this page can draw the character ch (one code point) as a glyph of its own.
V.canDraw = function (ch) {
  let ok = GLYPHS.known.get(ch);
  if (ok !== undefined) return ok;
  if (/^\s$/u.test(ch)) ok = true;
  else if (ALWAYS_ESCAPED.test(ch)) ok = false;
  else {
    const probe = glyphProbe();
    if (!probe) ok = FIXED_DRAWN.test(ch);
    else {
      const alpha = probe.draw(ch);
      ok = alpha.some((x) => x !== 0) && !probe.boxes.some((box) => sameAlpha(alpha, box));
    }
  }
  GLYPHS.known.set(ch, ok);
  return ok;
};

V.escapeChar = (ch) => {
  const cp = ch.codePointAt(0);
  return cp > 0xffff ? `\\u{${cp.toString(16).toUpperCase()}}` : `\\u${cp.toString(16).toUpperCase().padStart(4, "0")}`;
};

// text cut into [piece, original] pairs: text the page draws (original false), or one character it
// cannot draw, escaped (original: that character); null when it can draw all of them (printable
// ASCII is never probed).
V.glyphPieces = function (text) {
  if (/^[\x20-\x7e\n\t]*$/.test(text)) return null;
  const out = [];
  let plain = "", any = false;
  for (const ch of text) {
    if (V.canDraw(ch)) { plain += ch; continue; }
    if (plain) out.push([plain, false]);
    out.push([V.escapeChar(ch), ch]);
    plain = "";
    any = true;
  }
  if (plain) out.push([plain, false]);
  return any ? out : null;
};

// ---- token view ------------------------------------------------------------------------------

function tokenLabel(part, i) {
  const p = part.prompt_length;
  const id = part.ids[i];
  if (i < p) return `token ${i} · id ${id} · prompt`;
  const j = i - p;
  if (part.loss_mask[j] !== 1) return `token ${i} · response ${j} · id ${id} · mask 0 (context)`;
  return `token ${i} · response ${j} · id ${id} · mask 1 · logp ${part.logp[j]} (p=${Math.exp(part.logp[j]).toFixed(4)})`;
}

function showText(t) {
  return t.replace(/\n/g, "↵\n").replace(/\t/g, "→\t");
}

function renderPart(part, index) {
  const box = h("section", { class: "tokpart", "data-part": index });
  box.append(h("h3", {}, part.label));
  const versions = [...new Set(part.versions.map(String))];
  box.append(V.kvTable([
    ["tokens", `${V.fmtInt(part.ids.length)} (prompt ${V.fmtInt(part.prompt_length)}, response ${V.fmtInt(part.response_length)})`],
    ["sampled (mask 1)", V.fmtInt(part.loss_mask.filter((m) => m === 1).length)],
    ["/generate calls", `${part.spans.length}, weight versions ${versions.join(", ") || "–"}`],
  ]));
  if (part.problem) box.append(h("p", { class: "note err" }, `The token fields do not line up (${part.problem}): shown without colouring.`));
  if (part.segments.length > 1) {
    box.append(h("table", { class: "grid segments" },
      h("tr", {}, ["segment", "starts at response index", "tokens", "sampled", "calls"].map((x) => h("th", {}, x))),
      part.segments.map((s, k) => h("tr", {}, [k + 1, s.start, s.tokens, s.sampled, s.calls].map((x) => h("td", {}, String(x)))))));
    box.append(h("p", { class: "note" }, "Several segments: a prompt that did not extend the tokens so far (policy.history=rerender or a " +
      "context compaction) starts a new segment; a trainer gets each segment as its own sample."));
  }
  const area = h("div", { class: "toks" });
  const frag = document.createDocumentFragment();
  const p = part.prompt_length;
  const callAt = new Map();  // response index -> call number, where a call's span starts
  part.spans.forEach(([a, b], j) => { if (b > a && !callAt.has(a)) callAt.set(a, j); });
  const segAt = new Set(part.segment_starts);
  const vIndex = new Map(versions.map((v, k) => [v, k]));
  const versionOf = new Array(part.response_length).fill(null);
  part.spans.forEach(([a, b], j) => { for (let x = a; x < b; x++) versionOf[x] = j; });
  const colour = !part.problem;
  // The first prompt (system prompt, tools, the user's opening) is folded: open it to see it.
  const fold = p > 0 ? h("details", { class: "promptfold" }, h("summary", {}, `prompt: ${V.fmtInt(p)} tokens (the system prompt with the tools, and the conversation's opening)`)) : null;
  if (fold) frag.append(fold);
  for (let i = 0; i < part.ids.length; i++) {
    const j = i - p;
    if (j >= 0 && segAt.has(j)) {
      frag.append(h("div", { class: "segmark" }, `segment ${[...segAt].filter((s) => s <= j).length + 1} starts: a new prompt`));
    }
    if (j >= 0 && callAt.has(j)) {
      const c = callAt.get(j);
      const v = String(part.versions[c]);
      frag.append(h("span", { class: `callmark v${vIndex.get(v) % 6}`, title: `/generate call ${c}: response tokens [${part.spans[c][0]}, ${part.spans[c][1]}), weight version ${v}` },
        `call ${c} · v${v}`));
    }
    let cls = "tok";
    if (colour) cls += j < 0 ? " p" : part.loss_mask[j] === 1 ? " m1" : " m0";
    if (colour && j >= 0 && versionOf[j] !== null) cls += ` v${vIndex.get(String(part.versions[versionOf[j]])) % 6}`;
    const f = part.flags ? part.flags[i] : 0;
    if (f & 1) cls += " sp";
    if (f & 2) cls += " partial";
    const text = part.text ? part.text[i] : `<${part.ids[i]}>`;
    let title = tokenLabel(part, i);
    if (colour && j >= 0 && versionOf[j] !== null) title += ` · call ${versionOf[j]} · weight version ${part.versions[versionOf[j]]}`;
    if (f & 2) title += " · part of a multi-byte character (its vocabulary piece)";
    const shown = showText(text);
    const pieces = V.glyphPieces(shown);
    if (pieces) {
      const escaped = [...new Set(pieces.filter((x) => x[1]).map((x) => "U+" + x[1].codePointAt(0).toString(16).toUpperCase().padStart(4, "0")))];
      title += ` · shown escaped: ${escaped.join(", ")} (no font of this browser draws it, or it is invisible)`;
    }
    const el = document.createElement("span");
    el.className = pieces ? cls + " esc" : cls;
    el.dataset.i = i;
    el.title = title;
    if (pieces) el.append(...pieces.map(([x, ch]) => (ch ? h("span", { class: "escaped" }, x) : x)));
    else el.textContent = shown;
    (j < 0 && fold ? fold : frag).append(el);
  }
  area.append(frag);
  box.append(area);
  return box;
}

V.renderTokens = function (data) {
  const box = h("div", { id: "tokens" });
  box.append(h("div", { class: "legend" },
    h("span", { class: "tok p" }, "prompt"), h("span", { class: "tok m0" }, "mask 0: context (tool results, user turns, template)"),
    h("span", { class: "tok m1" }, "mask 1: sampled by the policy"), h("span", { class: "callmark v0" }, "call · weight version"),
    h("span", { class: "muted" }, " hover a token for its id and rollout log-prob")));
  if (data.tokenizer_error) box.append(h("p", { class: "note warn" }, data.tokenizer_error));
  else box.append(h("p", { class: "muted" }, `decoded token by token with ${data.tokenizer} (↵ marks a newline)`));
  data.parts.forEach((part, k) => box.append(renderPart(part, k)));
  return box;
};

// The info bar at the bottom follows the hovered token.
document.addEventListener("mouseover", (ev) => {
  const bar = document.getElementById("tokinfo");
  const t = ev.target;
  if (t && t.classList && t.classList.contains("tok") && t.title) {
    bar.textContent = t.title;
    bar.hidden = false;
  }
});
