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
causal LM with the policy's weights). Exit status 0 when exact, 1 when not, 2 on a bad config.
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
from aiohttp import web

from rollout.app.preflight import check_config
from rollout.core.config import Config, ConfigError, load_config
from rollout.core.episode import parse_request_id
from rollout.core.export import get_exporter
from rollout.core.records import InteractionResult, TrainingSample
from rollout.core.sample_modes import segments

logger = logging.getLogger(__name__)

# Episode settings of the check, applied before the user's overrides: long enough episodes (10+
# turns) with short turns, one sample per task. Short turns are cut at max_new_tokens, and
# policy.on_length=keep carries them on (the check is of tokens and log-probs over many turns, not
# of what a cut turn should become).
CHECK_DEFAULTS = ["env.max_steps=12", "policy.sampling.max_new_tokens=32", "policy.on_length=keep", "env.user.max_tokens=24",
                  "rollout.n_samples_per_task=1"]


class RecordingProxy:
    """An HTTP proxy in front of a router that records every ``/generate`` exchange.

    ``calls[episode_id]`` is a list of ``(input_ids, generated_ids, log_probs)`` in request order
    (the episode id is the part of ``rid`` before ``#``). Binds 127.0.0.1 on a free port; use as
    ``async with RecordingProxy(router_url) as proxy: ... proxy.url ...``.
    """

    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.calls: dict[str, list[tuple[list[int], list[int], list[float]]]] = collections.defaultdict(list)
        self.url = ""

    async def _generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        headers = {k: v for k, v in request.headers.items() if k.lower().startswith("x-") or k.lower() == "authorization"}
        async with self._session.post(self.upstream + "/generate", json=body, headers=headers) as r:
            data = await r.json(content_type=None)
            status = r.status
        if status == 200 and isinstance(body.get("input_ids"), list):
            pairs = data["meta_info"]["output_token_logprobs"]
            eid = parse_request_id(str(body.get("rid", "")))[0]
            self.calls[eid].append((list(body["input_ids"]), [p[1] for p in pairs], [p[0] for p in pairs]))
        return web.json_response(data, status=status)

    async def __aenter__(self) -> "RecordingProxy":
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application(client_max_size=256 * 2**20)
        app.router.add_post("/generate", self._generate)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        await self._runner.cleanup()
        await self._session.close()


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


def _load_model(cfg: Config, model_path: str | None, vocab_size: int):
    if model_path:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(model_path, torch_dtype="float32").eval()
    if cfg.local.enabled and cfg.local.backend == "tiny":
        from rollout.devtools.local.tiny import build_tiny_model

        return build_tiny_model(vocab_size, cfg.local.tiny)
    raise ConfigError("the exactness check needs the policy's weights: use local.backend=tiny or pass --model PATH")


async def _run_episodes(cfg: Config, n: int) -> tuple[list[InteractionResult], RecordingProxy, Any]:
    from rollout.core.pool import make_specs
    from rollout.core.worker import RolloutWorker

    async with RecordingProxy(cfg.policy.router_url) as proxy:
        policy = dataclasses.replace(cfg.policy, router_url=proxy.url)
        worker = RolloutWorker(policy, cfg.env, cfg.logging, max_concurrent_episodes=n)
        ids = worker.domain.task_ids(cfg.env.task_split, cfg.env.task_ids)
        per_task = -(-n // len(ids))  # several samples per task when there are fewer tasks than episodes
        specs = make_specs(cfg.env.domain, ids[:n], per_task, seed=cfg.rollout.seed)[:n]
        try:
            results = await asyncio.gather(*[worker.run(s) for s in specs])
        finally:
            await worker.close()
    return results, proxy, worker


def check_exactness(cfg: Config, episodes: int, model_path: str | None = None) -> tuple[ExactnessReport, list[InteractionResult], dict]:
    """Run ``episodes`` episodes and check them (see the module docstring).

    Args:
        cfg: a validated config; the local stack is started when ``local.enabled``.
        episodes: how many episodes to run.
        model_path: a ``transformers`` model with the policy's weights (not needed with ``tiny``).

    Returns:
        ``(report, results, info)``; ``info`` has timings and the settings used.

    Raises:
        ConfigError: no way to get the policy's weights.
    """
    from rollout.app.wiring import resolve_endpoints
    from rollout.core.tokenizer import load_tokenizer

    # The weights first: a missing model (or torch) fails before minutes of episodes, not after.
    tokenizer = load_tokenizer(cfg.policy.tokenizer)
    model = _load_model(cfg, model_path, len(tokenizer))
    stack = None
    info: dict[str, Any] = {}
    try:
        if cfg.local.enabled:
            from rollout.devtools.local.stack import LocalStack

            stack = LocalStack(cfg.local, cfg.env.domain, cfg.policy.tokenizer, log_dir=Path(cfg.rollout.output_dir) / "check_stack_logs",
                               chat_format=cfg.policy.chat_format)
            stack.start()
            cfg = resolve_endpoints(cfg, stack.router_url)
        t0 = time.monotonic()
        results, proxy, worker = asyncio.run(_run_episodes(cfg, episodes))
        info["episodes_s"] = time.monotonic() - t0
    finally:
        if stack is not None:
            stack.stop()
    kwargs = {} if cfg.policy.enable_thinking is None else {"enable_thinking": cfg.policy.enable_thinking}
    report = ExactnessReport()
    exporter = get_exporter(cfg.rollout.sample_mode, keep_messages=False)
    t0 = time.monotonic()
    for res in results:
        if res.trajectory is None:
            logger.warning("episode %s produced no trajectory (%s): %s", res.spec.episode_id, res.status.value, res.metadata.get("error"))
            continue
        calls = proxy.calls.get(res.spec.episode_id, [])
        masked_n, diff, bad = 0, 0.0, id_mismatches(res, calls)
        samples = exporter.export(res)
        for smp in samples:  # one forward pass over each sample's own tokens
            p = smp.prompt_length
            masked = [i for i, m in enumerate(smp.loss_mask) if m == 1]
            recomputed = recompute_masked_log_probs(model, smp.tokens, [p + i for i in masked], cfg.policy.sampling.temperature) if masked else []
            diff = max([diff] + [abs(a - smp.rollout_log_probs[i]) for a, i in zip(recomputed, masked)])
            masked_n += len(masked)
            bad += sample_id_mismatches(smp, calls)
        base_diff, base_len = retokenized_baseline(res, tokenizer, worker.domain.tool_schemas, kwargs, worker.chat)
        report.episodes.append(EpisodeCheck(res.spec.episode_id, int(res.metadata.get("turns", 0)), masked_n, diff, bad, base_diff, base_len,
                                            samples=len(samples)))
    info["recompute_s"] = time.monotonic() - t0
    info["statuses"] = dict(collections.Counter(r.status.value for r in results))
    info["segments"] = sum(1 + len(r.trajectory.segment_starts) for r in results if r.trajectory is not None)
    info["compactions"] = sum(int(r.metadata.get("compactions") or 0) for r in results)
    info["sample_mode"] = str(cfg.rollout.sample_mode)
    return report, results, info


def format_report(report: ExactnessReport, threshold: float) -> str:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rollout.check", description="Exactness checks of rollout data.")
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("exactness", help="recompute log-probs of real episodes and compare")
    ex.add_argument("--config", "-c", default=None, help="YAML config (default: configs/local.yaml if present, as for python -m rollout)")
    ex.add_argument("--episodes", type=int, default=16)
    ex.add_argument("--min-turns", type=int, default=10, help="fail if an episode has fewer turns")
    ex.add_argument("--threshold", type=float, default=1e-3, help="largest allowed |log-prob difference|")
    ex.add_argument("--model", default=None, help="transformers model with the policy's weights (not needed with local.backend=tiny)")
    ex.add_argument("overrides", nargs="*")
    from rollout.app.cli import parse_args_with_overrides

    args = parse_args_with_overrides(parser, argv)

    if args.config is None and Path("configs/local.yaml").is_file():
        args.config = "configs/local.yaml"
    overrides = list(CHECK_DEFAULTS)
    user_keys = {o.split("=", 1)[0] for o in args.overrides}
    try:
        probe = load_config(args.config, args.overrides)
        # On the local tiny stack the user simulator is the tiny model too (through the router's
        # /v1/chat/completions), unless chosen explicitly: a scripted user stops at once on the
        # random model's replies and episodes would be one turn long.
        if probe.local.enabled and probe.local.backend == "tiny" and "env.user.kind" not in user_keys:
            overrides += ["env.user.kind=llm", "env.user.model=tiny", "env.user.temperature=1.0"]
        cfg = load_config(args.config, overrides + list(args.overrides))
        check_config(cfg)
    except (ConfigError, FileNotFoundError) as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    from rollout.core.logs import setup_logging

    setup_logging(cfg.logging)
    print(f"exactness check: {args.episodes} episodes of {cfg.env.domain}, sample mode {cfg.rollout.sample_mode}, backend {cfg.local.backend if cfg.local.enabled else cfg.policy.router_url}, "
          f"user {cfg.env.user.kind}, max_steps {cfg.env.max_steps}, max_new_tokens {cfg.policy.sampling.max_new_tokens}, "
          f"temperature {cfg.policy.sampling.temperature}")
    try:
        report, _, info = check_exactness(cfg, args.episodes, args.model)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    print(format_report(report, args.threshold))
    print(f"episode statuses {info['statuses']}; segments {info['segments']} (history {cfg.policy.history}), compactions "
          f"{info['compactions']} (context strategy {cfg.policy.context_strategy}); episodes took {info['episodes_s']:.1f}s, "
          f"recompute {info['recompute_s']:.1f}s")
    ok = report.passed(args.threshold, args.min_turns, args.episodes)
    print("PASS: the trajectories are exactly what the policy sampled" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
