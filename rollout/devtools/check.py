"""Checks users run against their own setup.

``python -m rollout.check exactness --config CONFIG [key=value ...]`` runs a few episodes through
a recording proxy placed in front of the router, then for each trajectory:

* compares every request's ``input_ids`` and generated ids (as they crossed the wire) with the
  final ``tokens``: the count of token ids that differ from what was sampled must be 0;
* cuts each episode into the samples of ``rollout.sample_mode`` (``trajectory``: one;
  ``per_turn``: one per assistant turn; ``merge_prefix``: turns merged while prompts extend) and
  checks every sample against the wire too: its prompt is some request's ``input_ids``, every
  request whose ``input_ids`` the sample starts with agrees with the sample's tokens where their
  generated ids lie in it (masked 1 in the response), and every masked token was generated;
* recomputes the log-prob of every loss-masked token of every SAMPLE with the same model in one
  forward pass over that sample's own tokens (``log_softmax(logits / temperature)``) and takes
  the largest absolute difference from ``rollout_log_probs``: it must not exceed ``--threshold``
  (default 1e-3);
* for contrast, measures the seed's re-tokenizing baseline: render the final messages with the
  chat template, tokenize, and count the tokens that differ from the sampled trajectory.

With ``local.backend=tiny`` the model is the local stack's tiny model (rebuilt from
``local.tiny``, bit-identical to the server's); otherwise pass ``--model PATH`` (a ``transformers``
causal LM with the policy's weights). ``--formats`` checks several chat formats one after the other
(:func:`plan_runs` checks each one's packages before anything starts). Exit status 0 when exact, 1
when not, 2 on a bad config or a named format whose packages are not installed here.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import difflib
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from rollout.app.preflight import check_config
from rollout.core.config import Config, ConfigError, load_config
from rollout.core.export import get_exporter
from rollout.core.records import InteractionResult, TrainingSample
from rollout.core.sample_modes import segments
from rollout.devtools.check_engine import (
    RecordingProxy,
    UpdateReport,
    cross_update,
    next_version,
    open_engine,
    served_checkpoint,
    starting_weights,
    transformers_model,
    update_checkpoint,
)

logger = logging.getLogger(__name__)

# Episode settings of the check, applied before the user's overrides: long enough episodes (10+
# turns) with short turns, one sample per task. Short turns are cut at max_new_tokens, and
# policy.on_length=keep carries them on (the check is of tokens and log-probs over many turns, not
# of what a cut turn should become).
CHECK_DEFAULTS = ["env.max_steps=12", "policy.sampling.max_new_tokens=32", "policy.on_length=keep", "env.user.max_tokens=24",
                  "rollout.n_samples_per_task=1"]


@dataclass
class EpisodeCheck:
    """Exactness findings for one episode."""

    episode_id: str
    turns: int
    masked_tokens: int
    max_abs_logprob_diff: float
    id_mismatches: int
    baseline_differing_tokens: int
    baseline_length_delta: int
    samples: int = 1


@dataclass
class ExactnessReport:
    episodes: list[EpisodeCheck] = field(default_factory=list)

    @property
    def masked_tokens(self) -> int:
        return sum(e.masked_tokens for e in self.episodes)

    @property
    def max_abs_logprob_diff(self) -> float:
        return max((e.max_abs_logprob_diff for e in self.episodes), default=0.0)

    @property
    def id_mismatches(self) -> int:
        return sum(e.id_mismatches for e in self.episodes)

    def passed(self, threshold: float, min_turns: int, min_episodes: int) -> bool:
        return (
            len(self.episodes) >= min_episodes
            and all(e.turns >= min_turns for e in self.episodes)
            and self.max_abs_logprob_diff <= threshold
            and self.id_mismatches == 0
        )


def id_mismatches(result: InteractionResult, calls: list[tuple[list[int], list[int], list[float]]]) -> int:
    """Token ids of the final trajectory that differ from what each request sent and got back,
    plus generated tokens missing from the trajectory and generated positions not masked 1.

    A trajectory of several segments (``policy.history=rerender``, a compaction) is checked
    segment by segment: each request against the segment its ``input_ids`` share the longest
    prefix with. The trajectory is read as it is (never validated first): a corrupted one is
    counted, not refused."""
    traj = result.trajectory
    if traj is None:
        return sum(len(inp) + len(out) for inp, out, _ in calls)
    tokens, p, mask = traj.tokens, len(traj.prompt_ids), traj.loss_mask
    cuts = [0] + [p + s for s in traj.segment_starts] + [len(tokens)]
    segs = [tokens[a:b] for a, b in zip(cuts, cuts[1:])]
    sampled: set[int] = set()  # response indices some request generated
    bad = 0
    for inp, out, _ in calls:
        seq = inp + out
        at = max(range(len(segs)), key=lambda i: _common_prefix(segs[i], seq))
        seg, lo = segs[at], cuts[at]
        bad += len(seq) - min(len(seq), len(seg))
        bad += sum(1 for a, b in zip(seq, seg) if a != b)
        for k in range(len(inp), min(len(seq), len(seg))):
            i = lo + k - p
            if i < 0 or mask[i] != 1:
                bad += 1
        sampled.update(lo + k - p for k in range(len(inp), len(seq)))
    # every masked position must come from some request's output
    bad += sum(1 for i, m in enumerate(mask) if m == 1 and i not in sampled)
    return bad


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def sample_id_mismatches(sample: TrainingSample, calls: list[tuple[list[int], list[int], list[float]]]) -> int:
    """Token ids of one sample (any ``rollout.sample_mode``, any ``policy.history``) that disagree
    with the wire: 1 when its prompt is no request's ``input_ids``; for each of the sample's own
    requests (those whose ``input_ids`` extend the sample's prompt and are a prefix of its tokens),
    each of its generated ids inside the sample that differs, or is masked 0; and each masked
    response token none of them generated.

    Requests whose ``input_ids`` are shorter than the prompt are not the sample's: their ids lie in
    its prompt, which is checked whole against the wire by the first rule (with
    ``policy.history=rerender`` a later prompt holds the template's rendering of an earlier turn,
    not its sampled ids, by design; :func:`id_mismatches` checks the sampled ids of every request
    against the episode's segments)."""
    tokens, p = sample.tokens, sample.prompt_length
    bad = 0 if any(inp == tokens[:p] for inp, _, _ in calls) else 1
    sampled: set[int] = set()
    for inp, out, _ in calls:
        if len(inp) < p or len(inp) > len(tokens) or tokens[: len(inp)] != inp:
            continue
        for k in range(len(inp), min(len(inp) + len(out), len(tokens))):
            bad += int(tokens[k] != out[k - len(inp)]) + int(sample.loss_mask[k - p] != 1)
            sampled.add(k)
    return bad + sum(1 for i, m in enumerate(sample.loss_mask) if m == 1 and (p + i) not in sampled)


def retokenized_baseline(result: InteractionResult, tokenizer, tools: list[dict] | None, template_kwargs: dict,
                         chat: Any = None) -> tuple[int, int]:
    """The seed's way: render the final messages with the chat template and tokenize them (for a
    family without a chat template, its chat format, ``chat.prompt_ids``, re-renders the
    conversation up to the prompt of the last assistant turn).

    Returns:
        ``(differing_tokens, length_delta)`` against the sampled trajectory (tokens outside the
        matching blocks of a sequence alignment, on either side).
    """
    traj = result.trajectory
    msgs = [m for m in result.messages]
    # the trajectory stops after the last assistant turn: so does the baseline
    while msgs and msgs[-1]["role"] != "assistant":
        msgs.pop()
    reference = traj.tokens
    if traj.segment_starts:  # several segments: the last one is what the final messages render to
        reference = segments(result.to_sample(messages=False))[-1].tokens
    if getattr(tokenizer, "chat_template", None) or chat is None:
        text = tokenizer.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=False, **template_kwargs)
        ids = tokenizer.encode(text, add_special_tokens=False)
    else:
        # a family without a template: its format re-renders the conversation up to the last
        # assistant turn's prompt (a format such as mistral-common's renders no conversation that
        # ends with the assistant), compared with the trajectory up to that turn's first call
        while msgs and msgs[-1]["role"] == "assistant":
            msgs.pop()
        ids = list(chat.prompt_ids(msgs))
        if traj.generation_spans and not traj.segment_starts:
            reference = traj.tokens[: len(traj.prompt_ids) + traj.generation_spans[-1][0]]
    sm = difflib.SequenceMatcher(a=reference, b=ids, autojunk=False)
    same = sum(b.size for b in sm.get_matching_blocks())
    return (len(reference) - same) + (len(ids) - same), len(ids) - len(reference)


def recompute_masked_log_probs(model, tokens: list[int], positions: list[int], temperature: float) -> list[float]:
    """Log-probs of ``tokens[p]`` given ``tokens[:p]`` for each ``p`` in ``positions``, from one
    forward pass; the vocabulary projection is done only at the positions needed."""
    import torch

    t = temperature if temperature > 0 else 1.0
    with torch.inference_mode():
        ids = torch.tensor([tokens], dtype=torch.long)
        body = getattr(model, "model", None)
        rows = torch.tensor([p - 1 for p in positions], dtype=torch.long)
        if body is not None and hasattr(model, "lm_head"):
            hidden = body(input_ids=ids).last_hidden_state[0]
            logits = model.lm_head(hidden[rows]).float()
        else:
            logits = model(input_ids=ids).logits[0, rows].float()
        logp = torch.log_softmax(logits / t, dim=-1)
        target = torch.tensor([tokens[p] for p in positions], dtype=torch.long)
        return logp.gather(1, target[:, None])[:, 0].tolist()


async def _run_episodes(cfg: Config, n: int, update_path: Path | None, after_calls: int
                        ) -> tuple[list[InteractionResult], RecordingProxy, Any, str | None, UpdateReport | None]:
    """Run ``n`` episodes on one worker through a :class:`RecordingProxy`; with ``update_path``,
    cross a weight update to it once ``after_calls`` calls were answered (:func:`cross_update`).
    Returns ``(results, proxy, worker, the version the workers reported at the start, the update's report)``."""
    from rollout.core.policy import api_key_from_env
    from rollout.core.policy_engines import get_policy_engine
    from rollout.core.pool import make_specs
    from rollout.core.worker import RolloutWorker

    wire = get_policy_engine(cfg.policy.engine)
    async with RecordingProxy(cfg.policy.router_url, wire) as proxy:
        async with aiohttp.ClientSession() as session:
            admin = wire.admin(cfg.policy.router_url, session, api_key=api_key_from_env(cfg.policy.api_key_env))
            start = sorted({str(v) for v in (await admin.weight_versions()).values()})
        policy = dataclasses.replace(cfg.policy, router_url=proxy.url)
        worker = RolloutWorker(policy, cfg.env, cfg.logging, max_concurrent_episodes=n, partial_rollout=str(cfg.rollout.partial_rollout))
        ids = worker.domain.task_ids(cfg.env.task_split, cfg.env.task_ids)
        per_task = -(-n // len(ids))  # several samples per task when there are fewer tasks than episodes
        specs = make_specs(cfg.env.domain, ids[:n], per_task, seed=cfg.rollout.seed)[:n]
        done = asyncio.Event()
        updater = None
        if update_path is not None:
            updater = asyncio.create_task(cross_update(worker, proxy, cfg, update_path, next_version(start[-1] if start else None),
                                                       after_calls, done))
        try:
            results = await asyncio.gather(*[worker.run(s) for s in specs])
        finally:
            done.set()
            report = await updater if updater is not None else None
            await worker.close()
    return results, proxy, worker, (start[0] if len(start) == 1 else None), report


def _sample_check(models: dict[str | None, Any], smp: TrainingSample, temperature: float) -> tuple[float, int, collections.Counter]:
    """``(max |rollout - recomputed|, masked tokens, masked tokens per version)`` of one sample:
    each loss-masked token recomputed by the weights of the version that sampled it (one forward
    pass per version over the sample's tokens). ``models[None]`` serves every version when it is
    the only one. A version with no weights counts as an infinite difference."""
    versions = smp.token_weight_versions()
    by_version: dict[str | None, list[int]] = collections.defaultdict(list)
    for i, m in enumerate(smp.loss_mask):
        if m == 1:
            by_version[None if versions[i] is None else str(versions[i])].append(i)
    diff, p = 0.0, smp.prompt_length
    for v, masked in by_version.items():
        model = models.get(v, models.get(None))
        if model is None:
            logger.error("no weights for weight version %r (known: %s)", v, sorted(map(str, models)))
            return float("inf"), sum(map(len, by_version.values())), collections.Counter()
        recomputed = recompute_masked_log_probs(model, smp.tokens, [p + i for i in masked], temperature)
        diff = max([diff] + [abs(a - smp.rollout_log_probs[i]) for a, i in zip(recomputed, masked)])
    return diff, sum(map(len, by_version.values())), collections.Counter({str(v): len(ix) for v, ix in by_version.items()})


def _mode_report(mode: str, results: list[InteractionResult], proxy: RecordingProxy, models: dict, cfg: Config, tokenizer,
                 worker) -> tuple[ExactnessReport, collections.Counter]:
    """The findings of every episode cut into the samples of ``mode`` (the re-tokenizing baseline
    is measured too), and the masked tokens per weight version."""
    kwargs = {} if cfg.policy.enable_thinking is None else {"enable_thinking": cfg.policy.enable_thinking}
    exporter = get_exporter(mode, keep_messages=False)
    report, per_version = ExactnessReport(), collections.Counter()
    for res in results:
        if res.trajectory is None:
            logger.warning("episode %s produced no trajectory (%s): %s", res.spec.episode_id, res.status.value, res.metadata.get("error"))
            continue
        calls = proxy.calls.get(res.spec.episode_id, [])
        masked_n, diff, bad = 0, 0.0, id_mismatches(res, calls)
        samples = exporter.export(res)
        for smp in samples:
            d, n, counts = _sample_check(models, smp, cfg.policy.sampling.temperature)
            diff, masked_n = max(diff, d), masked_n + n
            per_version.update(counts)
            bad += sample_id_mismatches(smp, calls)
        base_diff, base_len = retokenized_baseline(res, tokenizer, worker.domain.tool_schemas, kwargs, worker.chat)
        report.episodes.append(EpisodeCheck(res.spec.episode_id, int(res.metadata.get("turns", 0)), masked_n, diff, bad, base_diff, base_len,
                                            samples=len(samples)))
    return report, per_version


def check_exactness(cfg: Config, episodes: int, model_path: str | None = None, update_weights: bool = False,
                    update_to: str | None = None) -> tuple[ExactnessReport, list[InteractionResult], dict]:
    """Run ``episodes`` episodes and check them (see the module docstring).

    Args:
        cfg: a validated config; the engine ``local`` asks for is started (the local stack, vLLM).
        episodes: how many episodes to run.
        model_path: a ``transformers`` model with the policy's weights (not needed with the local
            ``tiny`` or ``vllm`` backend).
        update_weights: cross a weight update mid-run, to a second checkpoint the check writes
            (:func:`rollout.devtools.check_engine.update_checkpoint`), or to ``update_to``.
        update_to: the second checkpoint's folder (implies ``update_weights``).

    Returns:
        ``(report, results, info)``: ``report`` for ``rollout.sample_mode``; ``info`` has timings,
        the settings used, ``info["modes"]`` (every registered sample mode's report) and
        ``info["update"]`` (the update's :class:`~rollout.devtools.check_engine.UpdateReport`).

    Raises:
        ConfigError: no way to get the policy's weights, or those of the update.
    """
    from rollout.core.export import sample_modes
    from rollout.core.tokenizer import load_tokenizer

    # The weights first: a missing model (or torch) fails before minutes of episodes, not after.
    tokenizer = load_tokenizer(cfg.policy.tokenizer)
    out = Path(cfg.rollout.output_dir)
    start_model = starting_weights(cfg, model_path, len(tokenizer))
    update_path = Path(update_to) if update_to else update_checkpoint(cfg, out) if update_weights else None
    info: dict[str, Any] = {"engine": None}
    with open_engine(cfg, out / "check_stack_logs") as (cfg, engine):
        info["engine"] = _engine_line(cfg, engine)
        t0 = time.monotonic()
        results, proxy, worker, start, update = asyncio.run(_run_episodes(cfg, episodes, update_path, 3 * episodes))
        info["episodes_s"] = time.monotonic() - t0
    models: dict[str | None, Any] = {start: start_model}
    if update is not None:
        models[update.version] = transformers_model(update_path)
    import torch

    # one thread: the servers and the actors share the cores (a 3,800-token forward took 0.69 s on
    # one thread and 2.1-3.3 s on two, measured on the loaded 2-core machine)
    torch.set_num_threads(1)
    t0 = time.monotonic()
    info["modes"] = {}
    for mode in sample_modes():
        info["modes"][mode] = _mode_report(mode, results, proxy, models, cfg, tokenizer, worker)
    report, info["tokens_per_version"] = info["modes"][str(cfg.rollout.sample_mode)]
    info["recompute_s"] = time.monotonic() - t0
    info["update"] = update
    info["statuses"] = dict(collections.Counter(r.status.value for r in results))
    info["segments"] = sum(1 + len(r.trajectory.segment_starts) for r in results if r.trajectory is not None)
    # append-only: one token sequence per episode (no segment), and every call's prompt + output
    # lies on it as sent and sampled (the episode's differing ids are 0)
    exact = {e.episode_id for e in report.episodes if e.id_mismatches == 0}
    info["append_only"] = sum(1 for r in results if r.trajectory is not None and not r.trajectory.segment_starts
                              and r.spec.episode_id in exact)
    info["compactions"] = sum(int(r.metadata.get("compactions") or 0) for r in results)
    info["continued_turns"] = sum(int(r.metadata.get("continued_turns") or 0) for r in results)
    info["sample_mode"] = str(cfg.rollout.sample_mode)
    info["history"] = str(cfg.policy.history)
    return report, results, info


def _engine_line(cfg: Config, engine) -> str:
    """One line naming what served the episodes: the engine and its version where it says."""
    if served_checkpoint(cfg) is not None and engine is not None:
        from rollout.devtools.local.vllm.processes import http_json

        stack = engine.stack
        try:
            version = http_json("GET", stack.worker_urls[0] + "/version")[1].get("version")
        except (OSError, AttributeError):
            version = "?"
        return (f"vLLM {version} (CPU): {len(stack.worker_urls)} server(s) behind vllm-router {stack.router_url}, "
                f"checkpoint {stack.model}")
    if engine is not None:
        return f"the local stack ({cfg.local.backend}) behind sglang-router {cfg.policy.router_url}"
    return f"policy.router_url {cfg.policy.router_url} (policy.engine={cfg.policy.engine})"


def format_report(report: ExactnessReport, threshold: float) -> str:
    """The report's lines for the config's sample mode (episodes, samples, masked tokens, the
    largest log-prob difference, differing ids, the re-tokenizing baseline)."""
    eps = report.episodes
    turns = [e.turns for e in eps]
    base_eps = sum(1 for e in eps if e.baseline_differing_tokens)
    lines = [
        f"episodes checked                     {len(eps)} (turns per episode: min {min(turns, default=0)}, max {max(turns, default=0)})",
        f"samples checked                      {sum(e.samples for e in eps)}",
        f"loss-masked tokens                   {report.masked_tokens}",
        f"max |rollout - recomputed| log-prob  {report.max_abs_logprob_diff:.3e} (threshold {threshold:.0e})",
        f"token ids differing from sampled     {report.id_mismatches}",
        f"re-tokenizing baseline (contrast)    {sum(e.baseline_differing_tokens for e in eps)} tokens differ from the sampled "
        f"trajectory in {base_eps}/{len(eps)} episodes (length delta {sum(e.baseline_length_delta for e in eps):+d})",
    ]
    return "\n".join(lines)


def format_modes_and_update(info: dict, update_path: str | None) -> str:
    """The lines for every sample mode's findings and for the mid-run update (when asked for)."""
    modes = "; ".join(f"{m}: {sum(e.samples for e in r.episodes)} samples, max |d| {r.max_abs_logprob_diff:.1e}, {r.id_mismatches} ids differ"
                      for m, (r, _) in info["modes"].items())
    lines = [f"every sample mode                    {modes}"]
    up: UpdateReport | None = info.get("update")
    if up is not None:
        what = (f"version {up.version} loaded on {len(up.workers)} worker(s) in {up.seconds:.2f}s with {up.calls_interrupted} call(s) "
                f"under way ({up.calls_before} answered before)" if up.crossed else "NOT crossed: every episode ended first")
        lines.append(f"weight update mid-run                {what}; turns continued {info['continued_turns']}; masked tokens per "
                     f"version {dict(sorted(info['tokens_per_version'].items()))}")
    return "\n".join(lines)


def passed_all(report: ExactnessReport, info: dict, args: argparse.Namespace) -> bool:
    """Every sample mode's report passes, and, when an update was asked for, it was crossed and
    tokens of both versions were checked."""
    ok = all(r.passed(args.threshold, args.min_turns, args.episodes) for r, _ in info["modes"].values())
    if str(info.get("history")) == "append":  # an appended history is one append-only sequence per episode
        ok = ok and info["append_only"] == len(report.episodes)
    up: UpdateReport | None = info.get("update")
    if args.update_weights or args.update_to:
        ok = ok and up is not None and up.crossed and up.version in info["tokens_per_version"] and len(info["tokens_per_version"]) >= 2
    return ok and report.passed(args.threshold, args.min_turns, args.episodes)


# The second chat format the check runs on local.backend=vllm unless --formats is given: a second
# vocabulary, since what the engine does with the vocabulary (its tokenizer, detokenized stop strings,
# end-of-turn ids) differs by family.
VLLM_SECOND_FORMAT = "qwen3.6"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rollout.check", description="Exactness checks of rollout data.")
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("exactness", help="recompute log-probs of real episodes and compare")
    ex.add_argument("--config", "-c", default=None, help="YAML config (default: configs/local.yaml if present, as for python -m rollout)")
    ex.add_argument("--episodes", type=int, default=16)
    ex.add_argument("--min-turns", type=int, default=10, help="fail if an episode has fewer turns")
    ex.add_argument("--threshold", type=float, default=1e-3, help="largest allowed |log-prob difference|")
    ex.add_argument("--model", default=None, help="transformers model with the policy's weights (not needed with local.backend=tiny or vllm)")
    ex.add_argument("--update-weights", action=argparse.BooleanOptionalAction, default=None,
                    help="cross a weight update mid-run to a second checkpoint (same shape, seed + 1) the check writes; "
                         "default: on with local.backend=vllm, off otherwise")
    ex.add_argument("--update-to", default=None, help="the second checkpoint's folder for the mid-run update (with --model)")
    ex.add_argument("--formats", default=None,
                    help="comma-separated chat formats to check one after the other, each with its built-in vocabulary (policy.tokenizer); "
                         f"default: the config's, and {VLLM_SECOND_FORMAT} too with local.backend=vllm")
    ex.add_argument("overrides", nargs="*")
    return parser


@dataclass
class Plan:
    """What ``python -m rollout.check exactness`` will run, decided before anything starts.

    Attributes:
        runs: ``(label, overrides)`` of each run, one per chat format, in order.
        skipped: ``(label, why)`` of each format the check would have added on its own and cannot
            run here (``why``: one line naming the missing packages and how to install them).
    """

    runs: list[tuple[str, list[str]]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def plan_runs(args: argparse.Namespace) -> Plan:
    """The runs of the check: one per chat format of ``--formats`` (its vocabulary as
    ``policy.tokenizer``), by default the config's (and :data:`VLLM_SECOND_FORMAT` on vLLM).

    Every planned format's packages are checked first (``FormatInfo.unavailable``: its renderer's
    and its vocabulary's, nothing imported), so that a format that cannot run here is known before
    any engine starts, not after the formats before it ran: one the user named (``--formats``, or
    the config's ``policy.chat_format``) is refused; the one the check adds on its own is skipped,
    with the reason (:attr:`Plan.skipped`).

    Raises:
        ConfigError: a named format cannot run here (one line: the format, the missing packages
            and the extra that installs them).
        ConfigError, FileNotFoundError, KeyError: a bad config or format name.
    """
    from rollout.core.formats.registry import AUTO, format_info

    probe = load_config(args.config, args.overrides)
    names = [n.strip() for n in args.formats.split(",")] if args.formats else [None]
    added = None
    if not args.formats and probe.local.enabled and probe.local.backend == "vllm" and probe.policy.chat_format != VLLM_SECOND_FORMAT:
        added = VLLM_SECOND_FORMAT
        names.append(added)
    plan = Plan()
    for name in names:
        if name is None:
            own = str(probe.policy.chat_format)
            why = None if own == AUTO else format_info(own).unavailable()  # auto: the tokenizer decides (the preflight)
            if why:
                raise ConfigError(f"policy.chat_format={own}: {why}")
            plan.runs.append((f"{own} ({probe.policy.tokenizer})", []))
            continue
        info = format_info(name)
        vocab = info.vocabulary
        vocab = None if vocab is None else vocab if vocab.startswith("builtin:") else f"builtin:{vocab}"
        label = f"{name} ({vocab or probe.policy.tokenizer})"
        why = info.unavailable()
        if why and name == added:
            plan.skipped.append((label, f"{why}; the check runs it by default on local.backend=vllm as a second vocabulary"))
            continue
        if why:
            raise ConfigError(f"--formats {name}: {why}")
        extra = [f"policy.chat_format={name}"] + ([f"policy.tokenizer={vocab}"] if vocab else [])
        out = f"rollout.output_dir={Path(probe.rollout.output_dir) / ('check_' + name)}"
        plan.runs.append((label, extra + ([out] if len(names) > 1 else [])))
    return plan


def _run_one(args: argparse.Namespace, label: str, extra: list[str]) -> int:
    """One check for one chat format: 0 passed, 1 failed, 2 bad config."""
    overrides = list(CHECK_DEFAULTS)
    user_keys = {o.split("=", 1)[0] for o in args.overrides}
    try:
        probe = load_config(args.config, args.overrides)
        # On the local tiny stack the user simulator is the tiny model too (through the router's
        # /v1/chat/completions), unless chosen explicitly: a scripted user stops at once on the
        # random model's replies and episodes would be one turn long.
        if probe.local.enabled and probe.local.backend == "tiny" and "env.user.kind" not in user_keys:
            overrides += ["env.user.kind=llm", "env.user.model=tiny", "env.user.temperature=1.0"]
        cfg = load_config(args.config, overrides + extra + list(args.overrides))
        check_config(cfg)
    except (ConfigError, FileNotFoundError) as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    update = args.update_weights if args.update_weights is not None else bool(cfg.local.enabled and cfg.local.backend == "vllm")
    args.update_weights = update
    print(f"exactness check of chat format {label}: {args.episodes} episodes of {cfg.env.domain}, sample mode {cfg.rollout.sample_mode}, "
          f"backend {cfg.local.backend if cfg.local.enabled else cfg.policy.router_url}, user {cfg.env.user.kind}, max_steps "
          f"{cfg.env.max_steps}, max_new_tokens {cfg.policy.sampling.max_new_tokens}, temperature {cfg.policy.sampling.temperature}", flush=True)
    try:
        report, _, info = check_exactness(cfg, args.episodes, args.model, update_weights=update, update_to=args.update_to)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    print(f"engine                               {info['engine']}")
    print(format_report(report, args.threshold))
    print(format_modes_and_update(info, args.update_to))
    print(f"append-only trajectories             {info['append_only']}/{len(report.episodes)} episodes: one token sequence, every "
          f"call's prompt + sampled ids a prefix of it")
    print(f"episode statuses {info['statuses']}; segments {info['segments']} (history {cfg.policy.history}), compactions "
          f"{info['compactions']} (context strategy {cfg.policy.context_strategy}); episodes took {info['episodes_s']:.1f}s, "
          f"recompute {info['recompute_s']:.1f}s")
    ok = passed_all(report, info, args)
    print("PASS: the trajectories are exactly what the policy sampled" if ok else "FAIL", flush=True)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """``python -m rollout.check exactness ...`` (see the module docstring): 0 when every run
    passes, 1 when one fails, 2 on a bad config."""
    from rollout.app.cli import parse_args_with_overrides

    args = parse_args_with_overrides(_parser(), argv)
    if args.config is None and Path("configs/local.yaml").is_file():
        args.config = "configs/local.yaml"
    try:
        plan = plan_runs(args)
    except (ConfigError, FileNotFoundError, KeyError) as e:
        print(f"config error: {e.args[0] if isinstance(e, KeyError) and e.args else e}", file=sys.stderr)
        return 2
    for label, why in plan.skipped:
        print(f"skipping chat format {label}: {why}", flush=True)
    from rollout.core.logs import setup_logging

    setup_logging(load_config(args.config, args.overrides).logging)
    codes = [_run_one(args, label, extra) for label, extra in plan.runs]
    if len(plan.runs) > 1 or plan.skipped:
        print(("PASS" if max(codes) == 0 else "FAIL") + f": {len(plan.runs)} of {len(plan.runs) + len(plan.skipped)} chat formats checked: "
              + ", ".join([f"{label} {'passed' if c == 0 else 'FAILED'}" for (label, _), c in zip(plan.runs, codes)]
                          + [f"{label} SKIPPED (not checked: {why.split(' (', 1)[0]})" for label, why in plan.skipped]))
    return max(codes)


if __name__ == "__main__":
    from rollout.core.pipes import pipe_safe

    sys.exit(pipe_safe(main))
