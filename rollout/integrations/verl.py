"""verl's agent loop for tau2 (and tau-bench): one episode on our episode loop per verl sample.

Importing this module imports verl (``verl.experimental.agent_loop``) and registers
:class:`Tau2AgentLoop` in verl's agent-loop registry as ``tau2_agent`` (:data:`AGENT_NAME`).
Nothing else in ``rollout`` imports it. Facts from verl 0.9.1's source
(``verl/experimental/agent_loop/agent_loop.py``): an agent loop subclasses ``AgentLoopBase``,
is registered by name (``@register(name)`` or an entry of the YAML that
``actor_rollout_ref.rollout.agent.agent_loop_config_path`` names, ``{name, _target_, ...}``), is
built per sample by ``hydra.utils.instantiate`` with the entry's other keys as keyword arguments,
and its ``async run(sampling_params, **row)`` returns an ``AgentLoopOutput`` for the row of the
dataset whose ``agent_name`` names it. ``AgentLoopWorker`` hands it the server manager
(``self.server_manager``), the model's tokenizer and the trainer's config.

What a run does:

1. Our config (domain, user simulator, ``env.max_steps``, chat format, stop strings, per-turn
   ``max_new_tokens``, ``on_parse_error``, ``rollout.train_statuses``, ``rollout.sample_mode``,
   timeouts) is the YAML named by the agent-loop entry's ``tau_rollout_config`` key, else the
   environment variable ``TAU_ROLLOUT_CONFIG``, else our defaults, with the entry's
   ``tau_rollout_overrides`` (``key=value`` strings) on top; loaded once per process, with the
   domain's data and tool sandbox. verl's sampling parameters (``temperature``, ``top_p``,
   ``top_k``; greedy in validation) and tokenizer are used, not ours; ``policy.router_url`` and
   ``pool.*`` (but ``pool.episode_timeout_s``) are not read.
2. The task is the row's ``extra_info["task_id"]`` (``extra_info["domain"]`` overrides
   ``env.domain``, ``extra_info["seed"]`` fixes the episode's seed):
   :mod:`rollout.integrations.verl_data` writes such a dataset.
3. :func:`rollout.core.episode.run_episode` runs it with our environment, user simulator and chat
   format, and verl's server manager as the policy client
   (:class:`~rollout.integrations.verl_client.VerlPolicyClient`). The episode's context is bounded
   by verl's: the first prompt P must fit ``rollout.prompt_length`` and the rest
   ``rollout.response_length`` (the loop's ``max_context_tokens`` becomes
   ``min(policy.max_context_tokens, P + response_length)``), so verl's padding never cuts a token.
   A first prompt longer than ``prompt_length`` ends the episode ``truncated`` (termination
   ``context``) before any call, with its prompt cut on the left as verl cuts its own, and a
   warning naming the key.
4. The result becomes ``AgentLoopOutput`` (:func:`rollout.integrations.verl_output.output_fields`):
   our tokens, loss mask (``response_mask``), rollout log-probs, the tau2 reward as
   ``reward_score`` (verl's reward loop is then skipped for the sample), our status and weight
   versions in ``extra_fields``. An episode whose status is not in ``rollout.train_statuses``
   gets a zero ``response_mask`` and ``extra_fields["tau2_trainable"] = False``.

Sample modes: verl's ``AgentLoopWorker`` takes ONE ``AgentLoopOutput`` per run. ``trajectory``
(default) gives one; ``merge_prefix`` with ``policy.history=append`` and no context strategy gives
the same one. ``per_turn``, ``policy.history=rerender`` and a ``policy.context_strategy`` give
several samples per episode: the loop refuses them when it is built, in one line, unless the
agent-loop entry sets ``multiple_outputs: true``; ``run`` then returns a list (one output per
sample, each with the episode's reward), the shape verl's TransferQueue worker
(``verl/trainer/ppo/v1/agent_loop_tq.py``: ``AgentLoopWorkerTQ._agent_loop_postprocess``) takes.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register

from rollout.core.formats import ChatFormat
from rollout.integrations.episodes import CONFIG_ENV, TaskEpisode, TaskRunner, episode_metrics, load_tau_config, several_samples_reason
from rollout.integrations.verl_client import VerlPolicyClient
from rollout.integrations.verl_data import AGENT_NAME
from rollout.integrations.verl_output import num_turns, output_fields

logger = logging.getLogger(__name__)

__all__ = ["AGENT_NAME", "CONFIG_ENV", "Tau2AgentLoop", "load_tau_config", "several_samples_reason"]

_ONE_OUTPUT = ("but verl's AgentLoopWorker takes one AgentLoopOutput per run: use rollout.sample_mode=trajectory, or set "
               "multiple_outputs: true in the agent-loop entry for verl's TransferQueue worker, which takes a list")


@register(AGENT_NAME)
class Tau2AgentLoop(AgentLoopBase):
    """verl's agent loop for one tau2 episode (see the module docstring).

    Args:
        *args, **kwargs: verl's (``AgentLoopBase``: trainer config, server manager, tokenizer, ...).
        tau_rollout_config: our YAML (the agent-loop entry's key); ``None``: ``$TAU_ROLLOUT_CONFIG``
            or the defaults.
        tau_rollout_overrides: ``key=value`` overrides of our config.
        multiple_outputs: allow several samples per episode (``run`` returns a list), for verl's
            TransferQueue worker.

    Raises:
        ValueError: the config may give several samples per episode and ``multiple_outputs`` is
            off (one line naming the key).
        rollout.core.config.ConfigError: a bad value in our YAML.
    """

    def __init__(self, *args: Any, tau_rollout_config: str | None = None, tau_rollout_overrides: Any = None,
                 multiple_outputs: bool = False, **kwargs: Any):
        kwargs.pop("name", None)  # the entry's own name, passed along by hydra
        super().__init__(*args, **kwargs)
        self.runner = TaskRunner(AGENT_NAME, "verl", tau_rollout_config, tau_rollout_overrides, multiple_outputs=multiple_outputs,
                                 one_output_hint=_ONE_OUTPUT)
        self.tau_cfg = self.runner.cfg
        self.multiple_outputs = self.runner.multiple_outputs
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        """Run the row's tau2 episode (see the module docstring).

        Args:
            sampling_params: verl's (``temperature``, ``top_p``, ``top_k``, ``logprobs``, ...).
            **kwargs: the dataset row: ``extra_info`` (``task_id``; ``domain``, ``seed``), ``uid``.

        Returns:
            One ``AgentLoopOutput``, or (``multiple_outputs``) a list of them, one per sample.

        Raises:
            ValueError: the row names no task (``extra_info["task_id"]``).
            KeyError: the task is not in the domain.
        """
        eos = getattr(self.tokenizer, "eos_token_id", None)

        def client_for(chat: ChatFormat, stop_ids: list[int]) -> VerlPolicyClient:
            return VerlPolicyClient(self.server_manager, sampling_params, stop_token_ids=stop_ids,
                                    end_ids=list(chat.eot_ids) + ([eos] if eos is not None else []), backend=str(self.rollout_config.name))

        t0 = time.monotonic()
        extra = dict(kwargs.get("extra_info") or {})
        limits = (None, None) if self.multiple_outputs else (self.prompt_length, self.response_length)
        ep = await self.runner.run(extra, self.tokenizer, client_for, template_kwargs=self.apply_chat_template_kwargs,
                                   group_id=str(kwargs.get("uid") or "") or None, prompt_limit=limits[0], response_limit=limits[1])
        outputs = self._outputs(ep, fallback=[int(eos if eos is not None else 0)])
        logger.debug("episode %s: %s, reward %.3f, %d sample(s), %.2fs", ep.result.spec.episode_id, ep.result.status.value, ep.result.reward,
                     len(outputs), time.monotonic() - t0)
        if self.multiple_outputs:
            return outputs
        if len(outputs) != 1:  # several_samples_reason refused every config that can do this
            raise RuntimeError(f"{AGENT_NAME}: episode {ep.result.spec.episode_id} gave {len(outputs)} samples in one-output mode")
        return outputs[0]

    def _outputs(self, ep: TaskEpisode, fallback: list[int]) -> list[AgentLoopOutput]:
        """verl's outputs for the episode's samples (:func:`rollout.integrations.verl_output.output_fields`)."""
        t = episode_metrics(ep.result)
        metrics = {"generate_sequences": t["generate_s"], "tool_calls": t["env_s"], "compute_score": t["reward_s"],
                   "num_preempted": ep.client.preempted}
        return [AgentLoopOutput(**self._fit(output_fields(s, trainable=ep.trainable, turns=num_turns(ep.result.messages), metrics=metrics,
                                                          versions=ep.client.versions, fallback_prompt=fallback)))
                for s in ep.samples]

    def _fit(self, fields: dict[str, Any]) -> dict[str, Any]:
        """In one-output mode, a prompt longer than verl's ``prompt_length`` (the episode ended
        before its first call) is cut on the left, as verl cuts its own; nothing of it is trained."""
        cut = len(fields["prompt_ids"]) - self.prompt_length
        if not self.multiple_outputs and cut > 0:
            fields["prompt_ids"] = fields["prompt_ids"][cut:]
            fields["extra_fields"]["tau2_prompt_cut"] = cut
        return fields
