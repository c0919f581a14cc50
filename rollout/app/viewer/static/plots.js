// Line plots of the GRPO example's train_log.jsonl, drawn as inline SVG (no plotting library).
"use strict";

const SVG = "http://www.w3.org/2000/svg";

function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

function tickText(v) {
  if (v === 0) return "0";
  const a = Math.abs(v);
  return a >= 1e4 || a < 1e-2 ? v.toExponential(1) : String(Math.round(v * 1000) / 1000);
}

// One plot of ys against xs (numbers; points whose y is not a number are left out).
V.linePlot = function (title, xs, ys, opts) {
  const W = 360, H = 210, L = 56, R = 12, T = 28, B = 34;
  const pts = xs.map((x, i) => [x, ys[i]]).filter(([x, y]) => typeof x === "number" && typeof y === "number" && isFinite(y));
  const svg = s("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: "plot", "data-title": title, role: "img" });
  svg.append(s("title", {}, title), s("text", { x: L, y: 16, class: "ptitle" }, title));
  if (!pts.length) {
    svg.append(s("text", { x: L, y: H / 2, class: "pnote" }, "no values"));
    return svg;
  }
  let x0 = Math.min(...pts.map((p) => p[0])), x1 = Math.max(...pts.map((p) => p[0]));
  let y0 = Math.min(...pts.map((p) => p[1])), y1 = Math.max(...pts.map((p) => p[1]));
  if (opts && opts.zero) y0 = Math.min(0, y0);
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
  const X = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const Y = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
  svg.append(s("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }), s("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }));
  for (const v of [y0, (y0 + y1) / 2, y1]) {
    svg.append(s("line", { x1: L - 4, y1: Y(v), x2: W - R, y2: Y(v), class: "grid" }),
      s("text", { x: L - 6, y: Y(v) + 4, class: "tick", "text-anchor": "end" }, tickText(v)));
  }
  const xt = [...new Set(pts.map((p) => p[0]))];
  const every = Math.max(1, Math.ceil(xt.length / 8));
  xt.forEach((x, i) => {
    if (i % every === 0 || i === xt.length - 1) svg.append(s("text", { x: X(x), y: H - B + 14, class: "tick", "text-anchor": "middle" }, String(x)));
  });
  svg.append(s("text", { x: (L + W - R) / 2, y: H - 4, class: "tick", "text-anchor": "middle" }, (opts && opts.xlabel) || "step"));
  svg.append(s("polyline", { points: pts.map(([x, y]) => `${X(x)},${Y(y)}`).join(" "), class: "pline" }));
  for (const [x, y] of pts) {
    svg.append(s("circle", { cx: X(x), cy: Y(y), r: 3.5, class: "pdot" }, s("title", {}, `step ${x}: ${y}`)));
  }
  return svg;
};

V.renderTrainLog = function (lines) {
  const box = h("div", { id: "trainlog" });
  if (!lines.length) {
    box.append(h("p", { class: "note" }, "No train_log.jsonl in this run (the GRPO example, launch/train_grpo_tiny.py, writes one)."));
    return box;
  }
  const steps = lines.map((l) => l.step);
  const col = (k) => lines.map((l) => l[k]);
  box.append(h("div", { class: "plots" },
    V.linePlot("reward mean", steps, col("reward_mean"), { zero: true }),
    V.linePlot("groups filtered", steps, col("groups_filtered"), { zero: true }),
    V.linePlot("max |trainer − rollout| log-prob", steps, col("max_abs_logprob_diff"), { zero: true })));
  const keys = ["step", "weight_version", "reward_mean", "groups_used", "groups_filtered", "max_abs_logprob_diff",
    "logprob_tokens_checked", "episodes_delivered", "update_interrupted_calls", "seconds"];
  box.append(h("table", { class: "grid" }, h("tr", {}, keys.map((k) => h("th", {}, k))),
    lines.map((l) => h("tr", {}, keys.map((k) => h("td", {}, l[k] === undefined ? "–" : typeof l[k] === "number" ? tickText(l[k]) : JSON.stringify(l[k])))))));
  return box;
};
