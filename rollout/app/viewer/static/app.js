// The viewer's page: routing (#/episodes, #/episode/RUN/ID/conversation|tokens, #/summary,
// #/train, #/compare), the live refresh, the episode table with its filters and sorting, the
// summary and the comparison of two runs.
"use strict";

const params = new URLSearchParams(location.search);
const POLL_MS = Math.max(200, Number(params.get("poll")) || 2000);

const S = {
  runs: ["a"],
  rows: { a: new Map() },      // episode id -> row, per run
  rev: { a: 0 },
  epoch: { a: null },
  state: {},
  sort: { key: "order", dir: 1 },
  filters: { status: "", outcome: "", domain: "", version: "", rmin: "", rmax: "", text: "" },
  changedOnly: false,
  limit: 1000,                 // rows drawn at most (a long run has thousands); "show all" lifts it
  route: "episodes",
  episodeCache: new Map(),
};

// ---- data ------------------------------------------------------------------------------------

async function pull(run) {
  const st = await V.api("state", { run });
  S.state[run] = st;
  let changed = false;
  if (st.epoch !== S.epoch[run]) {  // first load, or the folder's run was replaced
    S.rows[run] = new Map();
    S.rev[run] = 0;
    S.epoch[run] = st.epoch;
    S.episodeCache.clear();
    changed = true;
  }
  if (st.revision > S.rev[run] || changed) {  // rows, specs or the train log changed
    const got = await V.api("episodes", { run, since: S.rev[run] });
    for (const r of got.rows) S.rows[run].set(r.episode_id, r);
    S.rev[run] = got.revision;
    changed = true;
  }
  return changed;
}

async function pullAll() {
  let changed = false;
  for (const run of S.runs) changed = (await pull(run)) || changed;
  header();
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  return changed;
}

function header() {
  const st = S.state.a || {};
  const parts = [st.dir || ""];
  if (st.status && st.status !== "unknown") parts.push(`run ${st.status}`);  // no run.json: e.g. a GRPO example's folder
  parts.push(`${st.episodes || 0} episodes delivered`);
  if (st.submitted) parts.push(`of ${st.submitted} submitted`);
  if (st.pending) parts.push(`${st.pending} waiting for their group`);
  if (st.skipped_lines) parts.push(`${st.skipped_lines} malformed line(s) skipped`);
  if (S.state.b) parts.push(`compared with ${S.state.b.dir}`);
  const info = document.getElementById("runinfo");
  info.textContent = parts.join(" · ");
  info.dataset.status = st.status || "";
  document.querySelector('[data-route="train"]').hidden = !st.has_train_log;
  document.querySelector('[data-route="compare"]').hidden = S.runs.length < 2;
}

// ---- episode table ---------------------------------------------------------------------------

const COLUMNS = [
  ["order", "#"], ["episode_id", "episode"], ["task_id", "task"], ["domain", "domain"], ["status", "status"],
  ["outcome", "outcome"], ["reward", "reward"], ["turns", "turns"], ["tokens", "tokens"], ["generated", "sampled"],
  ["segments", "segments"], ["versions", "weight versions"], ["duration_s", "duration (s)"], ["termination", "end / error"],
];

function cell(r, key) {
  switch (key) {
    case "order": return String(r.order);
    case "status": return h("span", { class: V.statusClass(r.status) }, r.status);
    case "outcome": return r.reason ? `${r.outcome}: ${r.reason}` : r.outcome;
    case "reward": return r.raw_reward !== r.reward ? h("span", { title: `raw (tau2's) ${V.fmtReward(r.raw_reward)}` }, `${V.fmtReward(r.reward)} (raw ${V.fmtReward(r.raw_reward)})`) : V.fmtReward(r.reward);
    case "tokens": case "generated": return V.fmtInt(r[key]);
    case "versions": return r.versions.join(", ");
    case "duration_s": return V.fmtNum(r.duration_s, 2);
    case "termination": return r.error ? h("span", { class: "err", title: r.error }, r.error.slice(0, 80)) : (r.termination || "");
    default: return String(r[key] ?? "");
  }
}

function sortValue(r, key) {
  if (key === "task_id") return /^\d+$/.test(r.task_id) ? Number(r.task_id) : r.task_id;
  if (key === "versions") return r.versions.join(",");
  if (key === "termination") return r.error || r.termination || "";
  const v = r[key];
  return v === null || v === undefined ? -Infinity : v;
}

function filtered(run) {
  const f = S.filters;
  const lo = f.rmin === "" ? -Infinity : Number(f.rmin);
  const hi = f.rmax === "" ? Infinity : Number(f.rmax);
  const text = f.text.trim().toLowerCase();
  const out = [...S.rows[run].values()].filter((r) =>
    (!f.status || r.status === f.status) && (!f.outcome || r.outcome === f.outcome) && (!f.domain || r.domain === f.domain) &&
    (!f.version || r.versions.includes(f.version)) && r.reward >= lo && r.reward <= hi &&
    (!text || r.task_id === text || r.episode_id.toLowerCase().includes(text) || (r.error || "").toLowerCase().includes(text)));
  const { key, dir } = S.sort;
  out.sort((a, b) => {
    const x = sortValue(a, key), y = sortValue(b, key);
    return (x < y ? -1 : x > y ? 1 : 0) * dir || a.order - b.order;
  });
  return out;
}

function options(id, values, current, label) {
  const sel = document.getElementById(id);
  const want = ["", ...[...values].sort()];
  if (sel.options.length === want.length && [...sel.options].every((o, i) => o.value === want[i])) return;
  sel.replaceChildren(...want.map((v) => h("option", { value: v }, v || `all ${label}`)));
  sel.value = want.includes(current) ? current : "";
}

function filterBar() {
  const f = S.filters;
  const on = (key) => (ev) => { f[key] = ev.target.value; renderRows(); };
  return h("div", { class: "filters" },
    h("select", { id: "f-status", onchange: on("status") }), h("select", { id: "f-outcome", onchange: on("outcome") }),
    h("select", { id: "f-domain", onchange: on("domain") }), h("select", { id: "f-version", onchange: on("version") }),
    h("label", {}, "reward ", h("input", { id: "f-rmin", type: "number", step: "0.1", placeholder: "min", value: f.rmin, oninput: on("rmin") }),
      " – ", h("input", { id: "f-rmax", type: "number", step: "0.1", placeholder: "max", value: f.rmax, oninput: on("rmax") })),
    h("input", { id: "f-text", type: "search", placeholder: "task id, episode id or error text", value: f.text, oninput: on("text") }),
    h("button", { id: "f-clear", onclick: () => { Object.keys(f).forEach((k) => (f[k] = "")); renderEpisodes(); } }, "clear filters"),
    h("span", { id: "rowcount", class: "muted" }));
}

function renderRows() {
  const tbody = document.querySelector("#episodes tbody");
  if (!tbody) return;
  const rows = [...S.rows.a.values()];
  options("f-status", new Set(rows.map((r) => r.status)), S.filters.status, "statuses");
  options("f-outcome", new Set(rows.map((r) => r.outcome)), S.filters.outcome, "outcomes");
  options("f-domain", new Set(rows.map((r) => r.domain)), S.filters.domain, "domains");
  options("f-version", new Set(rows.flatMap((r) => r.versions)), S.filters.version, "weight versions");
  const matching = filtered("a");
  const shown = matching.slice(0, S.limit);
  tbody.replaceChildren(...shown.map((r) => h("tr", { "data-id": r.episode_id, class: "row", onclick: () => { location.hash = V.episodeHash("a", r.episode_id); } },
    COLUMNS.map(([key]) => h("td", { "data-col": key }, cell(r, key))))));
  const count = document.getElementById("rowcount");
  count.textContent = `${matching.length} of ${rows.length} episodes`;
  if (shown.length < matching.length) {
    count.append(` (the first ${shown.length} shown) `, h("button", { onclick: () => { S.limit = Infinity; renderRows(); } }, "show all"));
  }
  document.querySelectorAll("#episodes th").forEach((th) => {
    th.dataset.sorted = th.dataset.key === S.sort.key ? (S.sort.dir > 0 ? "asc" : "desc") : "";
  });
}

function renderEpisodes() {
  const view = document.getElementById("view");
  const head = h("tr", {}, COLUMNS.map(([key, label]) => h("th", {
    "data-key": key, title: `sort by ${label}`,
    onclick: () => { S.sort = { key, dir: S.sort.key === key ? -S.sort.dir : 1 }; renderRows(); },
  }, label)));
  view.replaceChildren(filterBar(), h("table", { id: "episodes", class: "grid" }, h("thead", {}, head), h("tbody", {})));
  renderRows();
}

// ---- one episode -----------------------------------------------------------------------------

async function renderEpisode(run, id, tab) {
  const view = document.getElementById("view");
  const order = filtered(run).map((r) => r.episode_id);
  const k = order.indexOf(id);
  const nav = (j) => (j >= 0 && j < order.length ? h("a", { href: V.episodeHash(run, order[j], tab) }, j < k ? "← previous" : "next →") : h("span", {}));
  const row = S.rows[run].get(id);
  view.replaceChildren(h("div", { class: "epnav" }, h("a", { href: run === "a" ? "#/episodes" : "#/compare" }, "↑ back"), nav(k - 1), nav(k + 1)),
    h("h2", { id: "eptitle" }, `episode ${id}` + (run === "b" ? " (compared run)" : "")),
    row ? V.kvTable([["task", `${row.domain} ${row.task_id} (group ${row.group_id}, sample ${row.sample_index}, attempt ${row.attempt})`],
      ["status", h("span", { class: V.statusClass(row.status) }, row.status)], ["reward", V.fmtReward(row.reward)],
      ["raw reward (tau2's, unshaped)", V.fmtReward(row.raw_reward)],
      ...(row.task_issues.length ? [["task's open issues", row.task_issues.join("; ")]] : []),
      ["outcome", row.reason ? `${row.outcome}: ${row.reason}` : row.outcome], ["turns", String(row.turns)],
      ["tokens", `${V.fmtInt(row.tokens)} (${V.fmtInt(row.generated)} sampled, ${row.segments} segment(s))`],
      ["weight versions", row.versions.join(", ") || "–"], ["duration (s)", V.fmtNum(row.duration_s, 2)]], { id: "epinfo" }) : null,
    h("div", { class: "tabs" },
      h("a", { href: V.episodeHash(run, id, "conversation"), class: tab === "conversation" ? "on" : "", id: "tab-conversation" }, "Conversation"),
      h("a", { href: V.episodeHash(run, id, "tokens"), class: tab === "tokens" ? "on" : "", id: "tab-tokens" }, "Tokens")),
    h("div", { id: "eppane", class: "muted" }, "loading…"));
  const pane = document.getElementById("eppane");
  try {
    if (tab === "tokens") {
      const data = await V.api("tokens", { run, id });
      pane.replaceChildren(V.renderTokens(data));
    } else {
      const ep = await V.api("episode", { run, id });
      pane.replaceChildren(h("div", { class: "convgrid" }, V.renderConversation(ep), V.renderOutcome(ep)));
    }
    pane.className = "";
  } catch (e) {
    pane.replaceChildren(h("p", { class: "note err" }, String(e.message || e)));
  }
}

// ---- summary ---------------------------------------------------------------------------------

function countTable(id, title, counts, statuses) {
  const entries = Object.entries(counts || {}).sort((a, b) => b[1] - a[1]);
  return h("div", { class: "card" }, h("h3", {}, title),
    entries.length ? h("table", { id, class: "grid" }, entries.map(([k, n]) => h("tr", { "data-key": k }, h("td", { class: statuses ? V.statusClass(k) : "" }, k), h("td", { class: "num" }, String(n)))))
      : h("p", { class: "muted" }, "none"));
}

// eval.json of an evaluation (python -m rollout eval): per domain, pass^k and pass@k by k.
function evalCard(ev) {
  const card = h("div", { class: "card wide", id: "eval" }, h("h3", {}, "Evaluation (eval.json)"));
  for (const [domain, d] of Object.entries(ev.domains || {})) {
    const infra = Object.values(d.infrastructure_failures || {}).reduce((a, b) => a + b, 0);
    card.append(h("p", {}, h("b", {}, domain), `: ${d.tasks} tasks, ${d.trials} trials, ${infra} infrastructure failures, ${d.cancelled} cancelled;` +
      ` mean reward ${V.fmtReward(d.mean_reward)}`));
    card.append(h("table", { class: "grid", "data-domain": domain },
      h("tr", {}, ["k", "pass^k", "pass@k", "tasks counted"].map((x) => h("th", {}, x))),
      Object.keys(d.pass_hat_k || {}).map((k) => h("tr", { "data-k": k }, [k, V.fmtNum(d.pass_hat_k[k], 4), V.fmtNum(d.pass_at_k[k], 4),
        String(d.tasks_counted[k])].map((x) => h("td", {}, x))))));
  }
  return card;
}

async function renderSummary() {
  const view = document.getElementById("view");
  const data = await V.api("summary", { run: "a" });
  const live = data.live;
  const raw = live.mean_raw_reward_per_domain || {};
  const rewards = Object.fromEntries(Object.entries(live.mean_reward_per_domain).flatMap(([d, r]) => [[`${d} (${live.episodes_per_domain[d]} episodes)`, V.fmtReward(r)],
    ...(d in raw && raw[d] !== r ? [[`${d}: raw (tau2's, unshaped)`, V.fmtReward(raw[d])]] : [])]));
  const cards = [countTable("status-counts", "Episodes by status", live.status_counts, true),
    countTable("outcome-counts", "Outcome (result file)", live.outcome_counts),
    countTable("excluded-counts", "Kept out of training, by reason", live.excluded_counts),
    h("div", { class: "card" }, h("h3", {}, "Mean reward per domain"), h("p", { class: "muted" }, `over trainable statuses: ${live.train_statuses.join(", ")}`),
      V.kvTable(Object.entries(rewards), { id: "reward-per-domain" })),
    h("div", { class: "card" }, h("h3", {}, "Totals"), V.kvTable([["episodes", V.fmtInt(live.episodes)], ["mean turns", V.fmtNum(live.mean_turns, 2)],
      ["tokens", V.fmtInt(live.tokens)], ["sampled tokens", V.fmtInt(live.generated_tokens)]]))];
  if (live.errors.length) {
    cards.push(h("div", { class: "card wide" }, h("h3", {}, "Errors (first line, by count)"),
      h("table", { class: "grid" }, live.errors.slice(0, 30).map((e) => h("tr", {}, h("td", { class: "num" }, String(e.count)), h("td", { class: "err" }, e.kind))))));
  }
  const file = data.file;
  const fileCard = h("div", { class: "card wide" }, h("h3", {}, "summary.json"));
  if (file) {
    const keys = ["status", "reason", "episodes", "trained_samples", "samples", "sample_mode", "reward_shaping", "open_issues",
      "episodes_with_task_issues", "compactions", "tokens", "generated_tokens",
      "turn_boundary_repairs", "parse_errors", "length_cut_turns", "wall_s", "episodes_per_s", "resumed_sessions"];
    fileCard.append(V.kvTable(keys.filter((k) => k in file).map((k) => [k, typeof file[k] === "number" && !Number.isInteger(file[k]) ? V.fmtNum(file[k], 3) : String(file[k])])),
      file.groups ? V.kvTable(Object.entries(file.groups).map(([k, v]) => [k, String(v)])) : null,
      file.mean_raw_reward_per_domain ? V.kvTable(Object.entries(file.mean_reward_per_domain || {}).map(([d, r]) =>
        [`mean reward ${d}: trained / raw (tau2's)`, `${V.fmtReward(r)} / ${V.fmtReward(file.mean_raw_reward_per_domain[d])}`]), { id: "file-rewards" }) : null,
      file.skipped_tasks && file.skipped_tasks.open_issues ? V.kvTable([["tasks skipped (open issues)",
        `${file.skipped_tasks.open_issues}: ${file.skipped_tasks.task_ids.join(", ")}`]], { id: "skipped-tasks" }) : null,
      h("details", {}, h("summary", {}, "the whole file"), h("pre", {}, JSON.stringify(file, null, 2))));
  } else {
    fileCard.append(h("p", { class: "muted" }, "not written yet (the run writes it when it ends); the counts above are live."));
  }
  cards.push(fileCard);
  if (data.eval) cards.unshift(evalCard(data.eval));
  view.replaceChildren(h("div", { id: "summary", class: "cards" }, cards));
}

// ---- compare ---------------------------------------------------------------------------------

function side(x) {
  if (!x) return "–";
  const st = Object.entries(x.statuses).map(([k, n]) => `${k} ${n}`).join(", ");
  return `${V.fmtReward(x.mean_reward)}  (${x.episodes} ep: ${st})`;
}

async function renderCompare() {
  const view = document.getElementById("view");
  const data = await V.api("compare");
  const c = data.counts;
  const rows = data.tasks.filter((t) => !S.changedOnly || t.changed);
  const table = h("table", { id: "compare", class: "grid" },
    h("tr", {}, ["domain", "task", `A: mean reward`, `B: mean reward`, "Δ (B − A)"].map((x) => h("th", {}, x))));
  for (const t of rows) {
    const tr = h("tr", { class: "row" + (t.changed ? " changed" : ""), "data-task": `${t.domain}/${t.task_id}` },
      h("td", {}, t.domain), h("td", {}, t.task_id), h("td", {}, side(t.a)), h("td", {}, side(t.b)),
      h("td", { class: t.delta > 0 ? "yes" : t.delta < 0 ? "no" : "" }, t.delta === null ? (t.only ? `only in ${t.only.toUpperCase()}` : "–") : (t.delta > 0 ? "+" : "") + V.fmtReward(t.delta)));
    const detail = h("tr", { class: "detail", hidden: true }, h("td", { colspan: 5 }, h("div", { class: "sidebyside" },
      ["a", "b"].map((run) => h("div", {}, h("b", {}, run.toUpperCase() + " "), ...((t[run] || { episode_ids: [] }).episode_ids.map((id) => {
        const r = S.rows[run].get(id);
        return h("div", {}, h("a", { href: V.episodeHash(run, id) }, id), r ? `  ${r.status}, reward ${V.fmtReward(r.reward)}, ${r.turns} turns` : "");
      })))))));
    tr.addEventListener("click", () => { detail.hidden = !detail.hidden; });
    table.append(tr, detail);
  }
  view.replaceChildren(h("div", { id: "comparebox" },
    h("p", {}, h("b", {}, "A "), data.runs.a, h("br"), h("b", {}, "B "), data.runs.b),
    h("p", { id: "comparecounts" }, `${c.tasks} tasks; ${c.changed} changed reward (${c.better} higher in B, ${c.worse} lower); ` +
      `${c.only_a} only in A, ${c.only_b} only in B. Reward: mean over each run's trainable episodes of the task.`),
    h("label", {}, h("input", { type: "checkbox", id: "changed-only", checked: S.changedOnly, onchange: (e) => { S.changedOnly = e.target.checked; renderCompare(); } }),
      " changed tasks only"), table));
}

// ---- routing and refresh ---------------------------------------------------------------------

function parseRoute() {
  const parts = location.hash.replace(/^#\/?/, "").split("/");
  if (parts[0] === "episode" && parts.length >= 3) return { name: "episode", run: parts[1], id: decodeURIComponent(parts[2]), tab: parts[3] || "conversation" };
  return { name: ["summary", "train", "compare"].includes(parts[0]) ? parts[0] : "episodes" };
}

async function render() {
  const r = parseRoute();
  S.route = r.name;
  document.querySelectorAll("#nav a").forEach((a) => a.classList.toggle("on", a.dataset.route === (r.name === "episode" ? "episodes" : r.name)));
  const view = document.getElementById("view");
  document.getElementById("tokinfo").hidden = true;
  try {
    if (r.name === "episode") await renderEpisode(r.run, r.id, r.tab);
    else if (r.name === "summary") await renderSummary();
    else if (r.name === "train") view.replaceChildren(V.renderTrainLog((await V.api("trainlog", { run: "a" })).lines));
    else if (r.name === "compare") await renderCompare();
    else renderEpisodes();
  } catch (e) {
    view.replaceChildren(h("p", { class: "note err" }, String(e.message || e)));
  }
  document.body.dataset.route = r.name;
}

async function tick() {
  if (document.getElementById("live").checked) {
    try {
      const changed = await pullAll();
      if (changed) {
        if (S.route === "episodes") renderRows();
        else if (["summary", "compare", "train"].includes(S.route)) await render();
      }
    } catch (e) {
      document.getElementById("updated").textContent = `refresh failed: ${e.message || e}`;
    }
  }
  setTimeout(tick, POLL_MS);
}

async function start() {
  const first = await V.api("state", { run: "a" });
  S.runs = first.runs;
  for (const run of S.runs) { S.rows[run] = S.rows[run] || new Map(); S.rev[run] = 0; S.epoch[run] = null; }
  await pullAll();
  if (!location.hash && !S.rows.a.size && S.state.a.has_train_log) location.replace("#/train");  // a GRPO example's folder
  window.addEventListener("hashchange", () => { window.scrollTo(0, 0); render(); });
  await render();
  document.body.dataset.ready = "1";
  setTimeout(tick, POLL_MS);
}

start().catch((e) => {
  document.getElementById("view").replaceChildren(h("p", { class: "note err" }, `cannot reach the viewer: ${e.message || e}`));
});
