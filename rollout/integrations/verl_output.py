"""Our episode as verl's ``AgentLoopOutput`` fields (plain data: this module does not import verl).

``AgentLoopOutput`` (``verl/experimental/agent_loop/agent_loop.py``, verl 0.9.1) is one sequence:
``prompt_ids``, ``response_ids``, ``response_mask`` (1 on tokens the model generated),
``response_logprobs``, ``reward_score``, ``num_turns``, ``metrics`` (``AgentLoopMetrics``:
``generate_sequences``, ``tool_calls``, ``compute_score`` seconds and ``num_preempted``) and
``extra_fields``. What verl does with them, from the same file:

* ``AgentLoopWorker._agent_loop_postprocess`` pads the prompt on the left to
  ``rollout.prompt_length`` and the response on the right to ``rollout.response_length`` (so
  neither may be longer), and calls ``_compute_score``, which asks verl's reward loop for a score
  only when ``reward_score`` is ``None`` ("Some AgentLoop may have already computed the reward
  score, e.g SWE-agent"). ``_postprocess`` then writes each ``reward_score`` into ``rm_scores`` at
  the last response token, which the trainer reads as the reward (``trainer/ppo/reward.py``:
  ``extract_reward``). So the tau2 reward goes in ``reward_score``, and verl runs no reward
  function of its own for these samples.
* ``extra_fields["reward_extra_info"]`` (a dict with the same keys in every sample of a batch) is
  spread into the batch's non-tensor fields and named in ``meta_info["reward_extra_keys"]``; verl
  averages those per data source in validation, so the values here are numbers.
* The other ``extra_fields`` become per-sample non-tensor fields; ``min_global_steps`` /
  ``max_global_steps`` are the weight versions verl's fully async trainer checks for staleness.

The training policy (docs/design.md invariant 4): verl has no typed status, so an episode whose
status is not in ``rollout.train_statuses`` (an infrastructure failure by default) gets a
``response_mask`` of zeros (no token of it is trained), its reward (0.0 for those), and
``extra_fields["tau2_trainable"] = False``. Its reward still enters its group's baseline in
verl's advantage estimators (GRPO groups by ``uid`` over every sample of the batch): drop the
flagged samples there to keep them out entirely (docs/trainer.md, "verl").
"""

from __future__ import annotations

from typing import Any

from rollout.core.records import TrainingSample

__all__ = ["REWARD_EXTRA_KEYS", "output_fields", "num_turns"]

# The numeric per-sample values verl's validation averages (``reward_extra_info``); the same keys
# for every sample, as ``AgentLoopWorker._postprocess`` requires.
REWARD_EXTRA_KEYS = ("tau2_reward", "tau2_trainable")


def num_turns(messages: list[dict[str, Any]] | None) -> int:
    """verl's ``num_turns`` ("chat turns, including user, assistant, tool"): the conversation's
    messages after the system prompt (0 when the episode never started)."""
    return sum(1 for m in (messages or []) if m.get("role") != "system")


def output_fields(sample: TrainingSample, *, trainable: bool, turns: int, metrics: dict[str, Any],
                  versions: tuple[int, int] | None, fallback_prompt: list[int]) -> dict[str, Any]:
    """The keyword arguments of verl's ``AgentLoopOutput`` for one of our samples.

    Args:
        sample: one sample of the episode (the whole episode in ``trajectory`` mode, one turn in
            ``per_turn``): ``tokens`` (prompt P + response R ids), ``loss_mask`` and
            ``rollout_log_probs`` (R each).
        trainable: the episode's status is in ``rollout.train_statuses``; False zeroes the mask.
        turns: verl's ``num_turns`` (:func:`num_turns`).
        metrics: ``AgentLoopMetrics`` values (seconds; ``num_preempted``).
        versions: ``(min, max)`` of verl's ``global_steps`` over the episode's calls, or ``None``.
        fallback_prompt: the prompt to hand verl when the episode has no tokens at all (it failed
            before its first prompt was built): verl's padding needs one token at least.

    Returns:
        ``prompt_ids`` (P), ``response_ids``, ``response_mask``, ``response_logprobs`` (R each:
        the mask is ours or zeros, the log-probs ours, 0.0 where the mask is 0), ``reward_score``
        (the episode's reward, float), ``num_turns``, ``metrics`` and ``extra_fields`` (our status,
        ids, weight versions, ``reward_extra_info``; the keys in docs/trainer.md).

    Raises:
        ValueError: the sample is misaligned (mask or log-probs not R long).
    """
    r = sample.response_length
    if len(sample.loss_mask) != r or len(sample.rollout_log_probs) != r or r > len(sample.tokens):
        raise ValueError(f"sample {sample.episode_id or '?'} is misaligned: {len(sample.tokens)} tokens, response_length {r}, "
                         f"{len(sample.loss_mask)} mask, {len(sample.rollout_log_probs)} log-probs")
    p = len(sample.tokens) - r
    prompt = [int(t) for t in sample.tokens[:p]] or [int(t) for t in fallback_prompt]
    meta = sample.metadata
    extra = {
        "tau2_status": sample.status,
        "tau2_trainable": bool(trainable),
        "tau2_episode_id": sample.episode_id,
        "tau2_task_id": meta.get("task_id"),
        "tau2_domain": meta.get("domain"),
        "tau2_termination": meta.get("termination_reason"),
        "tau2_error": meta.get("error"),
        "tau2_turn_indices": sample.turn_indices,
        "tau2_metadata": dict(meta),
        "weight_versions": list(sample.weight_versions),
        "generation_spans": [list(sp) for sp in sample.generation_spans],
        "min_global_steps": None if versions is None else versions[0],
        "max_global_steps": None if versions is None else versions[1],
        "turn_scores": [],
        "tool_rewards": [],
        "tau2_task_issues": [i.to_dict() for i in sample.task_issues],
        # tau2's own reward (raw_reward); reward_score is what verl trains on (shaped with rollout.reward_shaping)
        "reward_extra_info": {"tau2_reward": float(sample.raw_reward), "tau2_trainable": 1.0 if trainable else 0.0},
    }
    return {
        "prompt_ids": prompt,
        "response_ids": [int(t) for t in sample.tokens[p:]],
        "response_mask": [int(m) for m in sample.loss_mask] if trainable else [0] * r,
        "response_logprobs": [float(x) for x in sample.rollout_log_probs],
        "reward_score": float(sample.reward),
        "num_turns": int(turns),
        "metrics": dict(metrics),
        "extra_fields": extra,
    }
