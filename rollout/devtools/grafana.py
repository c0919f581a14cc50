"""The Grafana dashboard of the pool's metrics, made from the metric registry, and a preview of it
rendered without Grafana.

* ``python -m rollout.devtools.grafana dashboard [--out docs/grafana/tau_rollout.json]`` writes the
  dashboard JSON (Grafana's dashboard model: rows of time-series panels, PromQL targets, a
  Prometheus datasource variable and ``domain`` / Ray session filters). The committed file is this
  command's output (a test checks it), and every metric of
  :data:`rollout.core.telemetry.METRICS` is in at least one panel.
* ``python -m rollout.devtools.grafana table`` prints the metrics table of docs/observability.md
  (made from the registry; a test checks that the page holds it).
* ``python -m rollout.devtools.grafana scrape --url http://127.0.0.1:PORT/metrics --out s.jsonl``
  records the ``tau_rollout`` series of Ray's metrics export port every ``--every`` seconds (one
  JSON line per scrape: ``{"t": unix seconds, "text": exposition}``) until ``--seconds`` pass or
  the file ``--until`` exists.
* ``python -m rollout.devtools.grafana render --scrapes s.jsonl --out docs/observability_dashboard.png``
  evaluates every panel's queries on those scrapes (the same forms the PromQL says: ``sum by``,
  ``rate`` over ``--window`` seconds, ``histogram_quantile`` with Prometheus' linear interpolation
  inside a bucket, a ratio of rates) and draws the panels in the dashboard's layout with
  matplotlib (the ``plot`` extra). It is a rendering of the dashboard's queries on real scrapes,
  not a Grafana screenshot; the image says so.

Only the query forms of :class:`Query` are used, so the preview needs no PromQL engine.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from rollout.core.telemetry import METRICS, MetricDef, Side
from rollout.core.telemetry import registry as R
from rollout.core.telemetry.promtext import Sample, parse

__all__ = ["ROWS", "Panel", "Query", "dashboard", "dashboard_json", "evaluate", "histogram_quantile", "main", "metrics_table", "panel_metrics",
           "read_scrapes", "record_scrapes", "render"]

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "tau_rollout.json"
SELECTOR = '{domain=~"$domain", SessionName=~"$session"}'
DS = {"type": "prometheus", "uid": "${datasource}"}


@dataclass(frozen=True)
class Query:
    """One panel target, in one of four forms.

    Attributes:
        form: ``rate`` (a counter's per-second rate, summed by ``by``), ``quantile`` (a
            histogram's ``q`` quantile over the rate window, by ``by``), ``gauge`` (a gauge's
            values aggregated with ``agg`` by ``by``) or ``ratio`` (``rate(metric) /
            rate(denominator_count)``: an exact mean from a sum counter and a histogram's count).
        metric: the metric.
        legend: Grafana's legend format (``{{label}}`` is the label's value).
        by: labels kept (summed over the others).
        q: the quantile (``quantile`` only).
        agg: ``sum`` or ``max`` (``gauge`` only).
        denominator: the histogram whose ``_count`` divides (``ratio`` only).
    """

    form: str
    metric: MetricDef
    legend: str
    by: tuple[str, ...] = ()
    q: float = 0.5
    agg: str = "sum"
    denominator: MetricDef | None = None

    def promql(self) -> str:
        """The PromQL of this target (Grafana's ``$__rate_interval`` as the rate window)."""
        name, by = self.metric.prometheus_name, ", ".join(self.by)
        group = f" by ({by})" if by else ""
        if self.form == "rate":
            return f"sum{group} (rate({name}{SELECTOR}[$__rate_interval]))"
        if self.form == "quantile":
            return f"histogram_quantile({self.q}, sum by ({', '.join(('le', *self.by))}) (rate({name}_bucket{SELECTOR}[$__rate_interval])))"
        if self.form == "gauge":
            return f"{self.agg}{group} ({name}{SELECTOR})"
        if self.form == "ratio":
            assert self.denominator is not None
            den = self.denominator.prometheus_name + "_count"
            return f"sum{group} (rate({name}{SELECTOR}[$__rate_interval])) / sum{group} (rate({den}{SELECTOR}[$__rate_interval]))"
        raise ValueError(f"unknown query form {self.form!r}")

    def metrics(self) -> tuple[MetricDef, ...]:
        return (self.metric,) if self.denominator is None else (self.metric, self.denominator)


@dataclass(frozen=True)
class Panel:
    """One time-series panel: a title, a Grafana unit id (``s``, ``short``, ``reqps``, ...),
    its targets and what it shows."""

    title: str
    unit: str
    queries: tuple[Query, ...]
    description: str


def _pq(metric: MetricDef, by: tuple[str, ...] = (), suffix: str = "") -> tuple[Query, ...]:
    """p50 and p99 of a histogram."""
    tag = "".join(f" {{{{{b}}}}}" for b in by)
    return (Query("quantile", metric, f"p50{tag}{suffix}", by, 0.5), Query("quantile", metric, f"p99{tag}{suffix}", by, 0.99))


ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    ("Episodes", (
        Panel("Episodes finished by status", "ops", (Query("rate", R.EPISODES_FINISHED, "{{status}}", ("status",)),),
              "Episodes the pool delivered per second, by final status (exactly once each)."),
        Panel("Queue and episodes in flight", "short", (
            Query("gauge", R.QUEUE_DEPTH, "queued at the driver"),
            Query("gauge", R.EPISODES_IN_FLIGHT, "in flight (driver)"),
            Query("gauge", R.EPISODES_RUNNING, "running (actors)")),
              "Episodes waiting for an actor slot, dispatched and not returned, and running on the actors."),
        Panel("Episodes submitted, started, re-queued", "ops", (
            Query("rate", R.EPISODES_SUBMITTED, "submitted"),
            Query("rate", R.EPISODES_STARTED, "started (actors)"),
            Query("rate", R.EPISODE_RETRIES, "re-queued (actor lost)")),
              "Per second: episodes queued, attempts started on the actors, attempts re-queued after an actor loss."),
        Panel("Episode duration", "s", _pq(R.EPISODE_DURATION), "Wall time of the delivered episodes, p50 and p99."),
        Panel("Turns per episode", "short", _pq(R.EPISODE_TURNS), "Assistant turns of the delivered episodes, p50 and p99."),
        Panel("Reward", "percentunit", (
            Query("ratio", R.REWARDS, "mean reward", denominator=R.REWARD),
            Query("quantile", R.REWARD, "p50", (), 0.5)),
              "Mean reward of the policy-outcome episodes (exact: the rewards counter over the histogram's count), and the median."),
    )),
    ("Policy servers (/generate)", (
        Panel("/generate answers by finish", "reqps", (Query("rate", R.GENERATE_REQUESTS, "{{finish}}", ("finish",)),),
              "Answered /generate calls per second, by finish type (abort: a weight update or a server abort)."),
        Panel("/generate latency", "s", _pq(R.GENERATE_LATENCY), "Round trip of the answering attempt, p50 and p99, all actors."),
        Panel("Input ids sent per second", "short", (Query("rate", R.GENERATE_INPUT_TOKENS, "actor {{actor}}", ("actor",)),),
              "Token ids the answered /generate calls sent (whole prompts: the servers' prefix cache holds most of them)."),
        Panel("Tokens generated per second", "short", (Query("rate", R.GENERATE_OUTPUT_TOKENS, "actor {{actor}}", ("actor",)),),
              "Token ids the policy servers generated in their answers."),
        Panel("Failures, retries, outages", "ops", (
            Query("rate", R.GENERATE_FAILURES, "calls failed"),
            Query("rate", R.GENERATE_RETRIES, "attempts retried"),
            Query("rate", R.BACKEND_OUTAGES, "breaker openings"),
            Query("gauge", R.BREAKER_OPEN, "actors with the breaker open")),
              "Per second: /generate calls that failed for good, attempts retried, circuit-breaker openings; and how many "
              "actors wait out an outage now."),
    )),
    ("User simulator and tools", (
        Panel("User simulator latency", "s", _pq(R.USER_LATENCY), "Wall time of each user-simulator turn, p50 and p99."),
        Panel("Tool latency", "s", _pq(R.TOOL_LATENCY), "Wall time of each agent tool call, p50 and p99."),
        Panel("User and tool failures", "ops", (
            Query("rate", R.USER_ERRORS, "user simulator errors"),
            Query("rate", R.TOOL_TIMEOUTS, "tool timeouts"),
            Query("rate", R.TOOL_ERRORS, "tool error results")),
              "Per second: user-simulator failures that ended an episode, tool calls stopped at env.step_timeout_s, tool "
              "results that are errors."),
    )),
    ("Actors", (
        Panel("Episodes running per actor", "short", (Query("gauge", R.EPISODES_RUNNING, "actor {{actor}}", ("actor",)),),
              "Episodes inside each actor's slots now: an uneven spread shows here."),
        Panel("Event-loop lag per actor", "s", _pq(R.LOOP_LAG, ("actor",)),
              "How late each actor's event loop wakes a coroutine (p50 and p99 of 50 ms probe sleeps)."),
        Panel("/generate answers per actor", "reqps", (Query("rate", R.GENERATE_REQUESTS, "actor {{actor}}", ("actor",)),),
              "Answered /generate calls per second on each actor."),
    )),
    ("Training streams and weights", (
        Panel("Samples excluded by reason", "ops", (Query("rate", R.SAMPLES_EXCLUDED, "{{reason}}", ("reason",)),),
              "Episode samples kept out of training per second, by reason."),
        Panel("Groups by outcome", "ops", (Query("rate", R.GROUPS, "{{outcome}}", ("outcome",)),),
              "GRPO groups per second: kept (handed out), filtered, dropped, cancelled."),
        Panel("Weight versions", "short", (
            Query("gauge", R.WEIGHT_VERSION, "trainer (driver)", agg="max"),
            Query("gauge", R.POLICY_WEIGHT_VERSION, "servers, actor {{actor}}", ("actor",), agg="max")),
              "The trainer's current version, and the version the servers reported in each actor's latest answer."),
        Panel("Pauses and weight updates", "s", (
            Query("quantile", R.PAUSE_DURATION, "pause p99 ({{mode}})", ("mode",), 0.99),
            Query("quantile", R.WEIGHT_UPDATE_DURATION, "update p99", (), 0.99)),
              "How long generation stayed paused, and how long each update_weights_from_disk took (p99 over the window)."),
    )),
)


def panel_metrics() -> set[str]:
    """The names of the metrics the dashboard's panels query."""
    return {m.name for _, panels in ROWS for p in panels for q in p.queries for m in q.metrics()}


def metrics_table(side: Side) -> str:
    """The markdown table of the metrics ``side`` records (docs/observability.md): the name
    Prometheus scrapes, the kind, the tags, the unit and the meaning, in registry order."""
    rows = ["| metric (as scraped) | type | tags | unit | meaning |", "|---|---|---|---|---|"]
    rows += [f"| `{m.prometheus_name}` | {m.kind.value} | {', '.join(m.tags)} | {m.unit} | {m.description} |" for m in METRICS if m.side is side]
    return "\n".join(rows) + "\n"


def _variable(name: str, label: str, label_name: str) -> dict:
    query = f"label_values({R.EPISODES_SUBMITTED.prometheus_name}, {label_name})"
    return {"name": name, "label": label, "type": "query", "datasource": DS, "definition": query,
            "query": {"query": query, "refId": name}, "refresh": 2, "includeAll": True, "multi": True, "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "hide": 0, "sort": 1, "options": []}


def dashboard() -> dict:
    """The dashboard, as Grafana's JSON model (three panels of 8 x 8 per row, a row header per section)."""
    panels: list[dict] = []
    y, pid = 0, 1
    for title, row in ROWS:
        panels.append({"type": "row", "title": title, "id": pid, "collapsed": False, "panels": [], "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        pid, y = pid + 1, y + 1
        for k, p in enumerate(row):
            x = 8 * (k % 3)
            if k and k % 3 == 0:
                y += 8
            panels.append({
                "type": "timeseries", "title": p.title, "description": p.description, "id": pid, "datasource": DS,
                "gridPos": {"h": 8, "w": 8, "x": x, "y": y},
                "fieldConfig": {"defaults": {"unit": p.unit, "min": 0, "custom": {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10,
                                                                                 "showPoints": "never", "spanNulls": True}},
                                "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                            "tooltip": {"mode": "multi", "sort": "desc"}},
                "targets": [{"datasource": DS, "expr": q.promql(), "legendFormat": q.legend, "refId": chr(ord("A") + i), "range": True}
                            for i, q in enumerate(p.queries)],
            })
            pid += 1
        y += 8
    return {
        "title": "tau-rollout", "uid": "tau-rollout", "editable": True, "schemaVersion": 39, "version": 1, "graphTooltip": 1,
        "description": "tau-rollout's pool and actors through Ray's metrics export (docs/observability.md). Made by "
                       "`python -m rollout.devtools.grafana dashboard`.",
        "tags": ["tau-rollout", "ray"], "timezone": "browser", "refresh": "10s", "time": {"from": "now-30m", "to": "now"},
        "annotations": {"list": []}, "links": [],
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus", "current": {}, "hide": 0,
             "refresh": 1, "options": [], "regex": ""},
            _variable("session", "Ray session", "SessionName"),
            _variable("domain", "Domain", "domain"),
        ]},
        "panels": panels,
    }


def dashboard_json() -> str:
    """:func:`dashboard` as the committed file's text (indented, sorted keys, trailing newline)."""
    return json.dumps(dashboard(), indent=2, sort_keys=True) + "\n"


# -- the preview: the panels' queries evaluated on recorded scrapes ----------------------------------
Scrape = tuple[float, list[Sample]]


def _by_series(samples: list[Sample], name: str, by: tuple[str, ...]) -> dict[tuple, float]:
    """Values of ``name`` summed by the labels ``by`` (a tuple of their values)."""
    out: dict[tuple, float] = {}
    for s in samples:
        if s.name == name:
            key = tuple(s.labels.get(b, "") for b in by)
            out[key] = out.get(key, 0.0) + s.value
    return out


def _rates(scrapes: list[Scrape], k: int, name: str, by: tuple[str, ...], window_s: float) -> dict[tuple, float]:
    """Per-second increase of counter ``name`` over the ``window_s`` seconds before scrape ``k``
    (from the latest scrape at least that old, else the first), by ``by``; a series absent from
    the older scrape had not counted yet (0)."""
    t, now = scrapes[k][0], _by_series(scrapes[k][1], name, by)
    j = max([i for i in range(k) if scrapes[i][0] <= t - window_s] or [0])
    if j == k:
        return {}
    t0, then = scrapes[j][0], _by_series(scrapes[j][1], name, by)
    return {key: max(0.0, v - then.get(key, 0.0)) / (t - t0) for key, v in now.items()}


def histogram_quantile(q: float, buckets: dict[float, float]) -> float:
    """Prometheus' ``histogram_quantile``: ``buckets`` maps upper bounds (``inf`` included) to
    cumulative counts; linear interpolation inside the bucket holding rank ``q * total``; the
    +Inf bucket answers the highest finite bound; NaN without observations."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return math.nan
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for b in bounds:
        c = buckets[b]
        if c >= rank:
            if math.isinf(b):
                return lower
            return lower + (b - lower) * ((rank - below) / (c - below) if c > below else 0.0)
        lower, below = b, c
    return lower


def evaluate(query: Query, scrapes: list[Scrape], k: int, window_s: float) -> dict[tuple, float]:
    """The value of ``query`` at scrape ``k``, per group of its ``by`` labels."""
    name = query.metric.prometheus_name
    if query.form == "rate":
        return _rates(scrapes, k, name, query.by, window_s)
    if query.form == "gauge":
        if query.agg == "sum":
            return _by_series(scrapes[k][1], name, query.by)
        out: dict[tuple, float] = {}
        for s in scrapes[k][1]:
            if s.name == name:
                key = tuple(s.labels.get(b, "") for b in query.by)
                out[key] = max(out.get(key, -math.inf), s.value)
        return out
    if query.form == "quantile":
        per_le = _rates(scrapes, k, name + "_bucket", ("le", *query.by), window_s)
        groups: dict[tuple, dict[float, float]] = {}
        for (le, *rest), v in per_le.items():
            groups.setdefault(tuple(rest), {})[float(le)] = v
        return {key: histogram_quantile(query.q, b) for key, b in groups.items()}
    if query.form == "ratio":
        num = _rates(scrapes, k, name, query.by, window_s)
        den = _rates(scrapes, k, query.denominator.prometheus_name + "_count", query.by, window_s)  # type: ignore[union-attr]
        return {key: (num.get(key, 0.0) / d if d > 0 else math.nan) for key, d in den.items()}
    raise ValueError(f"unknown query form {query.form!r}")


def _legend(query: Query, key: tuple) -> str:
    text = query.legend
    for b, v in zip(query.by, key):
        text = text.replace("{{" + b + "}}", v)
    return text


def render(scrapes: list[Scrape], out: Path, window_s: float = 30.0, caption: str = "") -> None:
    """Draw every panel of :data:`ROWS` from ``scrapes`` into the PNG ``out`` (matplotlib).

    Raises:
        ImportError: matplotlib is not installed (``pip install tau-rollout[plot]``).
        ValueError: fewer than two scrapes.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if len(scrapes) < 2:
        raise ValueError("need at least two scrapes")
    t0 = scrapes[0][0]
    xs = [(t - t0) / 60.0 for t, _ in scrapes]
    # grid rows: per section a header, then per line of three panels a gap (the panels' titles),
    # the plots and a gap (their axis labels)
    ratios: list[float] = []
    places: list[tuple[str, int, list[int]]] = []
    for title, panels in ROWS:
        header = len(ratios)
        ratios.append(0.8)
        plots = []
        for _ in range(math.ceil(len(panels) / 3)):
            ratios += [0.45, 3.0, 0.7]
            plots.append(len(ratios) - 2)
        places.append((title, header, plots))
    height = 0.5 * sum(ratios) + 1.0
    fig = plt.figure(figsize=(19, height), facecolor="#111217")
    grid = fig.add_gridspec(len(ratios), 3, height_ratios=ratios, hspace=0.0, wspace=0.16, top=1 - 0.9 / height, bottom=0.01, left=0.04,
                            right=0.99)
    fig.suptitle(caption, color="#d8d9da", fontsize=10.5, x=0.01, ha="left", y=1 - 0.15 / height, va="top")
    for (title, header, plots), (_, panels) in zip(places, ROWS):
        head = fig.add_subplot(grid[header, :])
        head.axis("off")
        head.text(0.0, 0.2, title, color="#d8d9da", fontsize=12.5, fontweight="bold", transform=head.transAxes)
        for k, p in enumerate(panels):
            ax = fig.add_subplot(grid[plots[k // 3], k % 3])
            ax.set_facecolor("#181b1f")
            for spine in ax.spines.values():
                spine.set_color("#2c3235")
            ax.tick_params(colors="#9fa7b3", labelsize=7)
            ax.set_title(p.title + f"  [{p.unit}]", color="#d8d9da", fontsize=9, loc="left")
            lines: dict[str, list[float]] = {}
            for q in p.queries:
                for kk in range(len(scrapes)):
                    for key, v in evaluate(q, scrapes, kk, window_s).items():
                        lines.setdefault(_legend(q, key), [math.nan] * len(scrapes))[kk] = v
            for label, ys in sorted(lines.items()):
                ax.plot(xs, ys, linewidth=1.2, label=label)
            top = max([v for ys in lines.values() for v in ys if math.isfinite(v)] or [0.0])
            ax.set_ylim(0, top * 1.25 if top > 0 else 1.0)  # room above the highest line for the legend
            if lines:
                ax.legend(fontsize=6.5, loc="upper left", facecolor="#181b1f", edgecolor="#2c3235", labelcolor="#d8d9da", ncol=3)
            else:
                ax.text(0.5, 0.5, "no data", color="#6e7680", ha="center", va="center", transform=ax.transAxes)
            ax.grid(color="#2c3235", linewidth=0.5)
            ax.set_xlabel("minutes", color="#6e7680", fontsize=7, labelpad=1)
    fig.savefig(out, dpi=80, facecolor=fig.get_facecolor())
    plt.close(fig)


def read_scrapes(path: Path, prefix: str = "ray_tau_rollout_") -> list[Scrape]:
    """The scrapes a ``scrape`` command recorded: ``[(unix seconds, samples)]`` in order."""
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            out.append((float(d["t"]), parse(d["text"], prefix)))
    return out


def record_scrapes(url: str, out: Path, every_s: float, seconds: float | None, until: Path | None) -> int:
    """Append one JSON line per scrape of ``url`` (its ``ray_tau_rollout_`` lines) to ``out``
    every ``every_s`` seconds, until ``seconds`` pass or ``until`` exists; returns the scrapes
    written (a scrape that fails is skipped)."""
    t_end = None if seconds is None else time.monotonic() + seconds
    n = 0
    with open(out, "a") as f:
        while (t_end is None or time.monotonic() < t_end) and not (until is not None and until.exists()):
            t = time.time()
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    text = "\n".join(x for x in r.read().decode("utf-8", "replace").splitlines() if x.startswith("ray_tau_rollout_"))
            except OSError:
                text = None
            if text is not None:
                f.write(json.dumps({"t": t, "text": text}) + "\n")
                f.flush()
                n += 1
            time.sleep(max(0.0, every_s - (time.time() - t)))
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rollout.devtools.grafana", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dashboard", help="write the dashboard JSON")
    d.add_argument("--out", type=Path, default=DEFAULT_OUT)
    sub.add_parser("table", help="print the metrics tables of docs/observability.md")
    s = sub.add_parser("scrape", help="record scrapes of a metrics export port")
    s.add_argument("--url", required=True)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--every", type=float, default=2.0)
    s.add_argument("--seconds", type=float)
    s.add_argument("--until", type=Path, help="stop once this file exists")
    r = sub.add_parser("render", help="draw the dashboard's panels from recorded scrapes (matplotlib)")
    r.add_argument("--scrapes", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--window", type=float, default=30.0, help="rate window, seconds")
    r.add_argument("--caption", default="")
    args = ap.parse_args(argv)
    if args.cmd == "dashboard":
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(dashboard_json())
        print(f"wrote {args.out} ({sum(len(p) for _, p in ROWS)} panels)")
    elif args.cmd == "table":
        for side in Side:
            print(f"{side.value}:\n\n{metrics_table(side)}")
    elif args.cmd == "scrape":
        n = record_scrapes(args.url, args.out, args.every, args.seconds, args.until)
        print(f"wrote {n} scrapes to {args.out}")
    else:
        scrapes = read_scrapes(args.scrapes)
        render(scrapes, args.out, args.window, args.caption)
        print(f"wrote {args.out} from {len(scrapes)} scrapes over {scrapes[-1][0] - scrapes[0][0]:.0f} s")
    return 0


if __name__ == "__main__":
    from rollout.core.pipes import pipe_safe

    sys.exit(pipe_safe(main))
