"""``python -m rollout.bench journal``: the driver's I/O per delivered episode, the old write path
against the new one, side by side in one process.

For every episode it delivers, the driver of ``python -m rollout run`` appends the episode's sample
to the run journal (``episodes.jsonl``, :class:`rollout.core.journal.RunJournal`) and, once the
episode's group is handed out, to its view (``samples.jsonl``, :class:`rollout.core.output.RunWriter`).
Both run on the driver's one thread, between two results: what they cost bounds the episodes per
second a driver can take in, whatever the number of actors and servers.

The ways, each writing the same ``--episodes`` samples (groups of ``--group``) into a fresh folder
under ``--dir`` (the disk a run writes to: its ``fsync`` latency is the figure that matters),
interleaved over ``--rounds`` rounds (median per episode reported):

* ``before``: the code before this bench: ``json.dumps`` of each journal line, then write, flush
  and ``fsync`` per episode; ``json.dumps`` of each view line;
* ``orjson``: :func:`rollout.core.fastjson.dumps_line` for both (the journal line encoded from the
  sample's own containers, :func:`rollout.core.journal.sample_line`), still one ``fsync`` per
  episode (``RunJournal.record(sync=True)``);
* ``after``: what the pool does now: ``record(sync=False)`` for each episode and one
  ``RunJournal.commit`` per pool call, here one per group (see :mod:`rollout.core.journal` for what
  is durable when).

The samples are synthetic, the size of the main job's (retail: about 7.1k tokens, of which 1.2k
generated, 12 messages), or the first ``--episodes`` lines of a run's ``episodes.jsonl``
(``--from DIR``). Printed per way: milliseconds per episode of encoding, of writing and syncing,
in all (wall), the process CPU, and fsyncs per episode; then the ratios against ``before``, and
the disk's ``fsync`` latency measured alone.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

WAYS = ("before", "orjson", "after")


def synthetic_samples(n: int, seed: int = 0) -> list:
    """``n`` training samples shaped like the main job's (retail, gold replay): 7,100 tokens,
    1,200 of them generated (mask and log-probs), 12 messages, the usual metadata."""
    from rollout.core.metrics import EpisodeMetrics
    from rollout.core.records import TrainingSample

    rng = random.Random(seed)
    out = []
    for i in range(n):
        resp = 1200
        mask = [1 if (k // 150) % 2 == 0 else 0 for k in range(resp)]
        lps = [round(-rng.random() * 3, 6) if m else 0.0 for m in mask]
        messages = [{"role": "system", "content": "You are a customer service agent. " * 40}]
        for t in range(5):
            messages += [{"role": "user", "content": f"I want to return order #W{rng.randrange(10**6)}, the item is broken. " * 3},
                         {"role": "assistant", "content": "Let me look that up.", "reasoning_content": None,
                          "tool_calls": [{"id": f"call_{t}", "type": "function",
                                          "function": {"name": "get_order_details", "arguments": json.dumps({"order_id": f"#W{t}"})}}]}]
        messages.append({"role": "tool", "tool_call_id": "call_4", "name": "get_order_details", "content": json.dumps({"items": [{"price": 12.5}] * 8})})
        gid = f"b0:retail:{i // 2}"
        metrics = EpisodeMetrics(turns=6, turn_boundary_repairs=5, termination_reason="agent_stop", reward_info={"db_match": True, "reward": 1.0},
                                 timings={"episode_s": 1.9, "generate_s": 0.4, "env_s": 0.2}, prompt_tokens=5893, generated_tokens=1200)
        meta = {"episode_id": f"{gid}:{i % 2}", "domain": "retail", "task_id": str(i // 2), **metrics.to_metadata(), "worker_pid": 4242,
                "weight_versions": [0] * 6}
        out.append(TrainingSample(tokens=[rng.randrange(151_000) for _ in range(7100)], response_length=resp, loss_mask=mask,
                                  rollout_log_probs=lps, reward=1.0, status="completed", group_id=gid, sample_index=i % 2,
                                  metadata=meta, messages=messages, weight_versions=[0] * 6,
                                  generation_spans=[[k * 200, k * 200 + 150] for k in range(6)]))
    return out


def samples_from(run_dir: str | Path, n: int) -> list:
    """The first ``n`` episodes of the run journal in ``run_dir``."""
    from rollout.core.journal import load_run

    return [s for s, _ in load_run(run_dir).episodes[:n]]


class _OldJournal:
    """The journal's write path before this bench (kept here as the baseline): a text file, one
    ``json.dumps`` line, ``flush`` and ``fsync`` per episode."""

    def __init__(self, path: Path):
        self.f = open(path, "a")  # noqa: SIM115 (closed by close())
        self.fsyncs = 0

    def record(self, sample, weight_version: int | None = None) -> None:
        line = sample.to_dict()
        if weight_version is not None:
            line["metadata"]["delivered_at_weight_version"] = int(weight_version)
        self.f.write(json.dumps(line) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())
        self.fsyncs += 1

    def close(self) -> None:
        self.f.close()


def _one(way: str, samples: list, group: int, folder: Path) -> dict[str, float]:
    """Write ``samples`` the way ``way`` does into ``folder``; seconds spent and fsyncs made."""
    from rollout.core.config import load_config
    from rollout.core.fastjson import dumps_line
    from rollout.core.journal import RunJournal, sample_line

    folder.mkdir(parents=True)
    view = open(folder / "samples.jsonl", "w" if way == "before" else "wb")  # noqa: SIM115
    if way == "before":
        journal: Any = _OldJournal(folder / "episodes.jsonl")
    else:
        journal = RunJournal.open(folder, load_config(None, ["local.enabled=true", f"rollout.output_dir={folder}"]))
        journal.fsyncs = 0
    encode = 0.0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for start in range(0, len(samples), group):
        members = samples[start:start + group]
        for s in members:  # the driver journals each episode as it is delivered ...
            if way == "before":
                journal.record(s, weight_version=0)
            else:
                journal.record(s, weight_version=0, sync=way == "orjson")
        if way == "after":
            journal.commit()  # ... and the pool's call ends: one fsync for the group
        t = time.perf_counter()  # the group's view lines (samples.jsonl), encoding timed apart
        data = "".join(json.dumps(s.to_dict()) + "\n" for s in members) if way == "before" else b"".join(dumps_line(s.to_dict()) for s in members)
        encode += time.perf_counter() - t
        view.write(data)
        view.flush()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    fsyncs = journal.fsyncs
    view.close()
    journal.close() if way == "before" else journal.close("finished")
    # the journal lines' encoding alone (same samples, nothing written), to split the figures
    t = time.perf_counter()
    for s in samples:
        if way == "before":
            line = s.to_dict()
            line["metadata"]["delivered_at_weight_version"] = 0
            json.dumps(line)
        else:
            sample_line(s, 0)
    encode += time.perf_counter() - t
    return {"wall_s": wall, "cpu_s": cpu, "encode_s": encode, "fsyncs": fsyncs}


def fsync_latency(folder: Path, n: int = 50) -> float:
    """Median seconds of one ``fsync`` after a 30 kB append, in ``folder``."""
    path = folder / "fsync-probe"
    times = []
    with open(path, "ab", buffering=0) as f:
        for _ in range(n):
            f.write(b"x" * 30_000)
            t = time.perf_counter()
            os.fsync(f.fileno())
            times.append(time.perf_counter() - t)
    path.unlink()
    return statistics.median(times)


def run(samples: list, group: int, rounds: int, base: Path) -> dict[str, Any]:
    """Every way ``rounds`` times, interleaved; per way the median of each figure per episode."""
    root = Path(tempfile.mkdtemp(prefix="bench-journal-", dir=base))
    try:
        per: dict[str, list[dict[str, float]]] = {w: [] for w in WAYS}
        for r in range(rounds):
            for w in (WAYS if r % 2 == 0 else WAYS[::-1]):
                per[w].append(_one(w, samples, group, root / f"{w}-{r}"))
        latency = fsync_latency(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    n = len(samples)
    rows = []
    for w in WAYS:
        med = {k: statistics.median(x[k] for x in per[w]) for k in per[w][0]}
        rows.append({"way": w, "episodes": n, "group": group, "encode_ms": 1e3 * med["encode_s"] / n,
                     "write_sync_ms": 1e3 * max(0.0, med["wall_s"] - med["encode_s"]) / n,
                     "wall_ms": 1e3 * med["wall_s"] / n, "cpu_ms": 1e3 * med["cpu_s"] / n, "fsyncs_per_episode": med["fsyncs"] / n})
    return {"rows": rows, "fsync_ms": 1e3 * latency, "dir": str(base), "rounds": rounds}


def format_table(result: dict[str, Any]) -> str:
    """The rows as a table, then each way's ratios against ``before``."""
    rows = result["rows"]
    head = f"{'way':<8} {'encode ms':>10} {'write+fsync ms':>15} {'wall ms':>9} {'CPU ms':>8} {'fsyncs':>7}   (per episode)"
    out = [head, "-" * len(head)]
    for r in rows:
        out.append(f"{r['way']:<8} {r['encode_ms']:>10.3f} {r['write_sync_ms']:>15.3f} {r['wall_ms']:>9.3f} {r['cpu_ms']:>8.3f} {r['fsyncs_per_episode']:>7.2f}")
    before = rows[0]
    for r in rows[1:]:
        out.append(f"{r['way']} / before: wall x{r['wall_ms'] / before['wall_ms']:.2f}, CPU x{r['cpu_ms'] / before['cpu_ms']:.2f}, "
                   f"encoding x{r['encode_ms'] / before['encode_ms']:.2f}, fsyncs x{r['fsyncs_per_episode'] / before['fsyncs_per_episode']:.2f}")
    out.append(f"one fsync alone on this disk ({result['dir']}): {result['fsync_ms']:.3f} ms (median); {result['rounds']} rounds, "
               f"{before['episodes']} episodes in groups of {before['group']}")
    return "\n".join(out)


def add_parser(sub) -> None:
    """Add the ``journal`` sub-command to ``sub`` (argparse sub-parsers); it sets ``run``."""
    p = sub.add_parser("journal", help="the driver's journal and view writes per episode: the old path against the new, side by side")
    p.add_argument("--episodes", type=int, default=228, help="episodes written per way and round (default: the main job's 228)")
    p.add_argument("--group", type=int, default=2, help="episodes per group: one commit per group on the new path")
    p.add_argument("--rounds", type=int, default=5, help="rounds, the ways interleaved (median reported)")
    p.add_argument("--dir", default="outputs", help="the folder to write in (its disk's fsync is measured; default ./outputs)")
    p.add_argument("--from", dest="from_dir", default=None, metavar="RUN_DIR", help="take the samples from a run's episodes.jsonl")
    p.add_argument("--json", default=None, metavar="FILE", help="write the figures as JSON")
    p.set_defaults(run=main_journal, overrides=[])


def main_journal(args) -> int:
    """Run the ``journal`` benchmark (see the module docstring); 0, or 2 for bad arguments."""
    if args.episodes < 1 or args.group < 1 or args.rounds < 1:
        print("error: --episodes, --group and --rounds must be >= 1", file=__import__("sys").stderr)
        return 2
    samples = samples_from(args.from_dir, args.episodes) if args.from_dir else synthetic_samples(args.episodes)
    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    result = run(samples, args.group, args.rounds, base)
    print(format_table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        print(f"json: {args.json}")
    return 0
