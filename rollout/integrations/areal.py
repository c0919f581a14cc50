"""AReaL's rollout workflow for tau2 (and tau-bench): one episode on our episode loop per data item.

Importing this module imports AReaL (``areal.api``) and torch; nothing else in ``rollout`` imports
it. Facts from AReaL 1.0.4's source:

* ``areal/api/workflow_api.py``: a workflow subclasses ``RolloutWorkflow`` and implements
  ``async arun_episode(engine, data) -> dict | None``: a dict of tensors of shape
  ``[batch, seqlen]`` (the rows of one trajectory), or ``None``, which "implies that this
  trajectory is rejected and will not be used for training". The engine's ``rollout_batch`` /
  ``prepare_batch`` / ``submit`` take the workflow as an instance, a class with
  ``workflow_kwargs``, or an import path (``"rollout.integrations.areal.Tau2Workflow"``).
* ``areal/workflow/multi_turn.py`` (AReaL's own multi-turn workflow) gives the tensors' meaning:
  ``input_ids`` (int32), ``loss_mask`` (int32, 1 on generated tokens), ``logprobs`` (float32, the
  sampled token's log-prob at its own position, 0.0 elsewhere), ``versions`` (int32, the weight
  version that generated each token, -1 elsewhere), ``attention_mask`` (bool) and ``rewards``
  (float32, one per row).
* ``areal/api/engine_api.py`` / ``io_struct.py`` / ``infra/remote_inf_engine.py``: the engine's
  ``agenerate(ModelRequest(rid, input_ids, gconfig, tokenizer)) -> ModelResponse`` with
  ``output_tokens``, ``output_logprobs``, ``output_versions`` (the engine's version per token) and
  ``stop_reason`` (``stop``, ``tool_calls``, ``length``; a call a weight update aborts is continued
  inside ``agenerate``, its tokens keeping their versions). One ``rid`` stays on one server (KV
  cache reuse), so every call of an episode uses the episode id. ``gconfig`` is
  ``GenerationHyperparameters``: ``max_new_tokens`` and ``max_tokens`` (prompt + generated) bound a
  call, ``stop_token_ids`` end it. The SGLang backend sends no per-request seed.

:class:`ArealPolicyClient` is our :class:`~rollout.core.policy.PolicyClient` over that call (stop
strings of one token as ``stop_token_ids``, as for verl; an exception is ``policy_error``).
:class:`Tau2Workflow` runs the item's task (``data["task_id"]``, or ``data["extra_info"]["task_id"]``
as :mod:`rollout.integrations.verl_data` writes it) and answers AReaL's tensors. Our training
policy maps onto AReaL's rejection: an episode whose status is not in ``rollout.train_statuses``
(an infrastructure failure by default) is answered ``None``, logged with its status, so it is never
trained and never enters a group's baseline. Sample modes: one row per episode for ``trajectory``
(and ``merge_prefix`` with the append-only history); ``per_turn``, ``rerender`` and a context
strategy are refused in one line unless ``multiple_outputs=True``, which answers one row per sample
(right-padded, ``attention_mask`` False on the padding), a shape AReaL's engine takes ("batch_size
can vary per trajectory depending on the workflow output", ``rollout_batch``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch
from areal.api.cli_args import GenerationHyperparameters
from areal.api.io_struct import ModelRequest
from areal.api.workflow_api import RolloutWorkflow

from rollout.core.formats import ChatFormat
from rollout.core.policy import Generation, PolicyServerError
from rollout.core.records import TrainingSample
from rollout.core.tokenizer import load_tokenizer
from rollout.integrations.episodes import TaskRunner

logger = logging.getLogger(__name__)

__all__ = ["ArealPolicyClient", "Tau2Workflow", "areal_tensors"]

_STOP = {"stop": "stop", "tool_calls": "stop", "length": "length", "abort": "abort"}


class ArealPolicyClient:
    """A :class:`~rollout.core.policy.PolicyClient` over AReaL's ``engine.agenerate``, for one episode.

    Args:
        engine: AReaL's inference engine (``RemoteSGLangEngine``, ``RemotevLLMEngine``, ...): its
            ``agenerate(ModelRequest) -> ModelResponse``.
        gconfig: AReaL's ``GenerationHyperparameters`` (temperature, top_p, top_k, greedy, ...);
            each call uses a copy with ``n_samples=1``, ``max_new_tokens`` the loop's budget,
            ``max_tokens`` the prompt plus that budget, and ``stop_token_ids`` extended.
        tokenizer: the policy's tokenizer (AReaL's ``ModelRequest.tokenizer``).
        stop_token_ids: ids that end a turn (one-token stop strings).

    Attributes:
        token_versions: per call, AReaL's version of each generated token (``output_versions``).
    """

    def __init__(self, engine: Any, gconfig: GenerationHyperparameters, tokenizer: Any, stop_token_ids: Iterable[int] = ()):
        self.engine = engine
        stops = list(gconfig.stop_token_ids or [])
        stops += [int(t) for t in stop_token_ids if int(t) not in stops]
        self.gconfig = gconfig.new(n_samples=1, stop_token_ids=stops)
        self.tokenizer = tokenizer
        self.token_versions: list[list[int]] = []

    async def generate(self, input_ids, max_new_tokens: int, rid: str, routing_key: str, seed: int | None = None) -> Generation:
        """One ``engine.agenerate`` call (``rid`` = the episode id; AReaL's SGLang backend sends no seed).

        Returns:
            A :class:`Generation`: the response's ids and log-probs, ``stop``/``tool_calls`` ->
            ``stop``, ``length``, ``abort``; ``weight_version`` = the newest version of its tokens
            (the engine's current one when it generated none).

        Raises:
            PolicyServerError: the engine raised (AReaL's retries spent), or log-probs are missing.
        """
        ids = [int(t) for t in input_ids]
        g = self.gconfig.new(max_new_tokens=int(max_new_tokens), max_tokens=len(ids) + int(max_new_tokens))
        try:
            resp = await self.engine.agenerate(ModelRequest(rid=routing_key, input_ids=ids, gconfig=g, tokenizer=self.tokenizer))
        except Exception as e:  # AReaL raises RuntimeError once its HTTP retries are spent
            raise PolicyServerError(f"AReaL engine agenerate failed: {e!r}") from e
        out = [int(t) for t in resp.output_tokens]
        lps = list(resp.output_logprobs or [])
        if len(lps) != len(out) or any(lp is None for lp in lps):
            raise PolicyServerError(f"AReaL engine answered {len(out)} ids with {len(lps)} log-probs")
        versions = [int(v) for v in (resp.output_versions or [])]
        self.token_versions.append(versions)
        version = max(versions) if versions else self.engine.get_version()
        return Generation(ids=out, log_probs=[float(x) for x in lps], finish_type=_STOP.get(str(resp.stop_reason), "stop"),
                          meta={"rid": rid, "stop_reason": resp.stop_reason}, weight_version=str(version))


def areal_tensors(samples: list[TrainingSample], token_versions: list[list[int]] | None = None) -> dict[str, torch.Tensor]:
    """AReaL's trajectory tensors for our samples, one row each, right-padded.

    Args:
        samples: the episode's samples (one for ``trajectory``): ``tokens`` (P + R), ``loss_mask``
            and ``rollout_log_probs`` (R each), ``generation_spans`` and ``weight_versions``.
        token_versions: per ``/generate`` call of the episode, each generated token's version
            (:attr:`ArealPolicyClient.token_versions`); used for a one-sample episode whose spans
            are its calls, else each call's ``weight_versions`` entry covers its span.

    Returns:
        ``input_ids`` (int32 ``[n, L]``), ``loss_mask`` (int32, 0 on the prompt and padding),
        ``logprobs`` (float32, 0.0 where the mask is 0), ``versions`` (int32, -1 where no token
        was generated), ``attention_mask`` (bool, False on padding), ``rewards`` (float32 ``[n]``).
    """
    width = max(len(s.tokens) for s in samples)
    rows: dict[str, list[list]] = {k: [] for k in ("input_ids", "loss_mask", "logprobs", "versions", "attention_mask")}
    for s in samples:
        p, pad = len(s.tokens) - s.response_length, width - len(s.tokens)
        versions = [-1] * len(s.tokens)
        exact = token_versions is not None and len(token_versions) == len(s.generation_spans) and all(
            len(v) == b - a for v, (a, b) in zip(token_versions, s.generation_spans))
        for k, (a, b) in enumerate(s.generation_spans):
            versions[p + a:p + b] = token_versions[k] if exact else [int(s.weight_versions[k] or 0)] * (b - a)
        rows["input_ids"].append(list(s.tokens) + [0] * pad)
        rows["loss_mask"].append([0] * p + list(s.loss_mask) + [0] * pad)
        rows["logprobs"].append([0.0] * p + list(s.rollout_log_probs) + [0.0] * pad)
        rows["versions"].append(versions + [-1] * pad)
        rows["attention_mask"].append([True] * len(s.tokens) + [False] * pad)
    return {
        "input_ids": torch.tensor(rows["input_ids"], dtype=torch.int32),
        "loss_mask": torch.tensor(rows["loss_mask"], dtype=torch.int32),
        "logprobs": torch.tensor(rows["logprobs"], dtype=torch.float32),
        "versions": torch.tensor(rows["versions"], dtype=torch.int32),
        "attention_mask": torch.tensor(rows["attention_mask"], dtype=torch.bool),
        "rewards": torch.tensor([float(s.reward) for s in samples], dtype=torch.float32),
    }


class Tau2Workflow(RolloutWorkflow):
    """AReaL's rollout workflow for one tau2 episode per data item (see the module docstring).

    Args:
        tokenizer: the policy's tokenizer, or a name :func:`rollout.core.tokenizer.load_tokenizer`
            loads (a local folder, ``builtin:qwen3``, a hub id).
        gconfig: AReaL's generation hyperparameters (default: AReaL's defaults).
        tau_rollout_config: our YAML; ``None``: ``$TAU_ROLLOUT_CONFIG`` or our defaults.
        tau_rollout_overrides: ``key=value`` overrides of our config.
        multiple_outputs: allow several samples per episode (one row each).
        template_kwargs: chat-template arguments (our ``policy.enable_thinking`` where unset).

    Attributes:
        last_result: the last episode's :class:`~rollout.core.records.InteractionResult` (its
            status, metadata and conversation), for inspection.

    Raises:
        ValueError: the config may give several samples per episode and ``multiple_outputs`` is off.
        rollout.core.config.ConfigError: a bad value in our YAML.
    """

    def __init__(self, tokenizer: Any, gconfig: GenerationHyperparameters | None = None, tau_rollout_config: str | None = None,
                 tau_rollout_overrides: Iterable[str] = (), multiple_outputs: bool = False, template_kwargs: dict[str, Any] | None = None):
        self.tokenizer = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
        self.gconfig = gconfig or GenerationHyperparameters()
        self.runner = TaskRunner("Tau2Workflow", "areal", tau_rollout_config, tau_rollout_overrides, multiple_outputs=multiple_outputs,
                                 one_output_hint="one row per sample: pass multiple_outputs=True to answer them as rows of one trajectory, "
                                                 "or use rollout.sample_mode=trajectory")
        self.cfg = self.runner.cfg
        self.multiple_outputs = self.runner.multiple_outputs
        self.template_kwargs = self.runner.template_kwargs(template_kwargs)
        self.last_result = None

    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> dict[str, torch.Tensor] | None:
        """Run the item's episode on ``engine``; AReaL's tensors, or ``None`` (not trainable).

        Args:
            engine: AReaL's inference engine.
            data: the item: ``task_id`` (or ``extra_info.task_id``); optional ``domain``, ``seed``.

        Raises:
            ValueError: the item names no task.
            KeyError: the task is not in the domain.
        """
        row = {**dict(data.get("extra_info") or {}), **{k: data[k] for k in ("task_id", "domain", "seed") if data.get(k) is not None}}

        def client_for(chat: ChatFormat, stop_ids: list[int]) -> ArealPolicyClient:
            return ArealPolicyClient(engine, self.gconfig, self.tokenizer, stop_token_ids=stop_ids)

        ep = await self.runner.run(row, self.tokenizer, client_for, template_kwargs=self.template_kwargs, keep_messages=False)
        res = self.last_result = ep.result
        if not ep.trainable:
            logger.info("episode %s (task %s): %s, not trainable (rollout.train_statuses): rejected for AReaL: %s", res.spec.episode_id,
                        res.spec.task_id, res.status.value, res.metadata.get("error"))
            return None
        return areal_tensors(ep.samples, ep.client.token_versions if len(ep.samples) == 1 else None)
