"""Our samples as slime's ``Sample``, and a drop-in for the seed's slime ``generate``.

Field names and status names are slime's (``slime/utils/types.py`` in THUDM/slime: the
``Sample`` dataclass and its nested ``Sample.Status`` enum, whose values are ``pending``,
``completed``, ``truncated``, ``aborted``, ``failed``). slime is not a dependency: :func:`to_slime`
returns plain dicts by default, and an object of the class it is given otherwise (slime's own
``Sample``, ``sample_cls="slime"``, when slime is installed).

What a sample becomes (``TrainingSample`` -> slime ``Sample``):

====================  ==========================================================================
slime field           from
====================  ==========================================================================
``tokens``            ``tokens`` (prompt + response ids, exactly what the policy saw and sampled)
``response_length``   ``response_length``
``loss_mask``         ``loss_mask`` (length ``response_length``; 1 exactly on sampled tokens)
``rollout_log_probs`` ``rollout_log_probs`` (length ``response_length``; 0.0 where the mask is 0)
``reward``            ``reward`` (tau2's, in [0, 1])
``status``            ``status`` mapped by :data:`SLIME_STATUS` (table below)
``remove_sample``     ``True`` when ``status`` is not in ``train_statuses`` or the sample was kept
                      out of training (``metadata["excluded_reason"]``: stale, zero variance, a
                      dropped group); slime then zeroes its loss mask, so infrastructure failures
                      are never trained as reward 0
``weight_versions``   ``weight_versions`` without the ``None`` entries (slime appends a call's
                      version only when the server reported one)
``session_id``        the episode id (our routing key, as slime's ``session_id`` is its)
``metadata``          our ``metadata`` plus ``status`` (ours), ``group_id``, ``sample_index``,
                      ``generation_spans`` and ``call_weight_versions`` (one per call, ``None`` kept)
``prompt``, ``response``  the texts when known (an ``asolve`` result has them), else ``""``
``index``, ``group_index``  as given (slime's own numbering), else ``None``
====================  ==========================================================================

Status, ours -> slime's ``Sample.Status`` (slime's own comment on ``FAILED``: "tool call failure,
external API error, parsing error", partial output kept; ``ABORTED``: generation was cut off):

==================================================================  ==========
ours                                                                slime
==================================================================  ==========
``completed``                                                       completed
``max_steps``, ``truncated``                                        truncated
``parse_error``, ``tool_timeout``                                   failed
``policy_error``, ``env_error``, ``user_error``, ``eval_error``     failed
``aborted``, ``timeout``, ``actor_lost``, ``cancelled``             aborted
==================================================================  ==========

Whether a sample is trained follows our ``rollout.train_statuses`` (``remove_sample``), not the
slime status, which cannot tell ``parse_error`` (a policy outcome) from ``env_error``; our exact
status stays in ``metadata["status"]``.

:func:`generate` has the signature of slime's ``--custom-generate-function-path`` functions
(``async generate(args, sample, sampling_params) -> Sample``), as the seed's
``generate_with_tau.generate`` does, so switching is one flag
(``--custom-generate-function-path rollout.integrations.slime.generate``).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from rollout.core import records
from rollout.core.choices import SampleMode
from rollout.core.config import Config, load_config
from rollout.core.export import get_exporter
from rollout.core.records import DEFAULT_TRAIN_STATUSES, EpisodeStatus, TrainingSample
from rollout.integrations.episodes import CONFIG_ENV, domain_state, env_config_for
from rollout.integrations.seed import SeedResult, TrainableAgent, make_env

logger = logging.getLogger(__name__)

SLIME_STATUS: dict[EpisodeStatus, str] = {
    EpisodeStatus.COMPLETED: "completed",
    EpisodeStatus.MAX_STEPS: "truncated",
    EpisodeStatus.TRUNCATED: "truncated",
    EpisodeStatus.PARSE_ERROR: "failed",
    EpisodeStatus.TOOL_TIMEOUT: "failed",
    EpisodeStatus.POLICY_ERROR: "failed",
    EpisodeStatus.ENV_ERROR: "failed",
    EpisodeStatus.USER_ERROR: "failed",
    EpisodeStatus.EVAL_ERROR: "failed",
    EpisodeStatus.ABORTED: "aborted",
    EpisodeStatus.TIMEOUT: "aborted",
    EpisodeStatus.ACTOR_LOST: "aborted",
    EpisodeStatus.CANCELLED: "aborted",
}

# The fields generate() leaves as slime set them: the sample's identity in slime's buffer (the
# prompt holds the task, so that slime can run the sample again).
_IDENTITY = frozenset({"prompt", "index", "group_index", "session_id"})


def slime_status(status: EpisodeStatus | str) -> str:
    """slime's ``Sample.Status`` value for one of our statuses (the module docstring's table).

    Raises:
        ValueError: ``status`` is not one of ours.
    """
    return SLIME_STATUS[EpisodeStatus(status)]


def _as_training_sample(sample: Any) -> tuple[TrainingSample, str, str]:
    """``(training sample, prompt text, response text)`` of any of our sample shapes.

    Raises:
        TypeError: none of those shapes.
        ValueError: a malformed record, or an episode of several segments (``policy.history=rerender``,
            a compaction), which is no one sequence: split it first.
    """
    if isinstance(sample, TrainingSample):
        out = sample, "", ""
    elif isinstance(sample, SeedResult):
        out = sample.to_sample(), sample.prompt, sample.response
    elif isinstance(sample, records.InteractionResult):
        out = sample.to_sample(), "", ""
    elif isinstance(sample, Mapping):
        try:
            out = TrainingSample.from_dict(dict(sample)), "", ""
        except TypeError as e:
            raise ValueError(f"not a samples.jsonl record: {e}") from None
    else:
        raise TypeError(f"cannot convert {type(sample).__name__} to slime's Sample: pass a TrainingSample, an InteractionResult, "
                        "asolve's SeedResult or a samples.jsonl record")
    if out[0].segment_starts:
        raise ValueError(f"episode {out[0].episode_id or '?'} has {len(out[0].segment_starts) + 1} segments (a re-rendered or "
                         "compacted history): convert the samples of rollout.core.export.get_exporter(mode).split(...) one by one")
    return out


def slime_fields(sample: Any, *, train_statuses: Iterable[str] = DEFAULT_TRAIN_STATUSES, index: int | None = None,
                 group_index: int | None = None) -> dict[str, Any]:
    """slime ``Sample`` field values for one of our samples (``status`` as its string value).

    Args:
        sample: a :class:`~rollout.core.records.TrainingSample`, a ``samples.jsonl`` record (dict), our
            :class:`~rollout.core.records.InteractionResult`, or an ``asolve`` result
            (:class:`rollout.integrations.seed.SeedResult`, which also gives the prompt and response texts).
        train_statuses: the statuses that may be trained (``rollout.train_statuses``); the others,
            and samples with ``metadata["excluded_reason"]`` (from ``filtered.jsonl``), get
            ``remove_sample=True``.
        index, group_index: slime's numbering of the sample and its group (``None``: unset).

    Returns:
        A dict keyed by slime's field names (the module docstring's table): ``tokens`` (length
        ``P + R``), ``response_length`` (``R``), ``loss_mask`` and ``rollout_log_probs`` (length
        ``R`` each), ``reward``, ``status``, ``remove_sample``, ``weight_versions``, ``session_id``,
        ``metadata``, ``prompt``, ``response``, ``index``, ``group_index``.

    Raises:
        TypeError: ``sample`` is none of those shapes.
        ValueError: a malformed record, an unknown status, or misaligned lengths.
    """
    ts, prompt, response = _as_training_sample(sample)
    r = ts.response_length
    if len(ts.loss_mask) != r or len(ts.rollout_log_probs) != r or r > len(ts.tokens):
        raise ValueError(f"sample {ts.episode_id or '?'} is misaligned: {len(ts.tokens)} tokens, response_length {r}, "
                         f"{len(ts.loss_mask)} mask, {len(ts.rollout_log_probs)} log-probs")
    metadata = {
        **ts.metadata,
        "status": ts.status,
        "group_id": ts.group_id,
        "sample_index": ts.sample_index,
        "generation_spans": [list(sp) for sp in ts.generation_spans],
        "call_weight_versions": list(ts.weight_versions),
        "raw_reward": float(ts.raw_reward),  # tau2's own; "reward" is what slime trains on (rollout.reward_shaping)
        "task_issues": [i.to_dict() for i in ts.task_issues],
    }
    return {
        "tokens": list(ts.tokens),
        "response_length": int(r),
        "loss_mask": [int(m) for m in ts.loss_mask],
        "rollout_log_probs": [float(x) for x in ts.rollout_log_probs],
        "reward": float(ts.reward),
        "status": slime_status(ts.status),
        "remove_sample": ts.status not in set(train_statuses) or bool(ts.metadata.get("excluded_reason")),
        "weight_versions": [str(v) for v in ts.weight_versions if v is not None],
        "session_id": ts.episode_id or None,
        "metadata": metadata,
        "prompt": prompt,
        "response": response,
        "index": index,
        "group_index": group_index,
    }


def slime_sample_class() -> type | None:
    """slime's ``Sample`` class when slime is importable (``slime.utils.types``, or
    ``slime.utils.core.types`` where a version keeps it there), else ``None``."""
    for module in ("slime.utils.types", "slime.utils.core.types"):
        try:
            mod = __import__(module, fromlist=["Sample"])
        except ImportError:
            continue
        cls = getattr(mod, "Sample", None)
        if cls is not None:
            return cls
    return None


def fill_sample(target: Any, fields: Mapping[str, Any], skip: Iterable[str] = ()) -> Any:
    """Set slime fields on a ``Sample``-like object, in place.

    ``status`` becomes a member of ``type(target).Status`` when the class has that enum (slime's
    does), else stays a string; the other fields are set as attributes, as slime's own
    ``Sample.from_dict`` sets keys it does not know.

    Args:
        target: the object (slime's ``Sample`` or a stand-in).
        fields: from :func:`slime_fields`.
        skip: field names to leave as they are.

    Returns:
        ``target``.

    Raises:
        ValueError: ``type(target).Status`` has no member for the status value.
    """
    skip = set(skip)
    status_enum = getattr(type(target), "Status", None)
    for key, value in fields.items():
        if key in skip:
            continue
        if key == "status" and status_enum is not None:
            value = status_enum(value)
        setattr(target, key, value)
    return target


def to_slime(sample: Any, sample_cls: type | str | None = None, *, train_statuses: Iterable[str] = DEFAULT_TRAIN_STATUSES,
             index: int | None = None, group_index: int | None = None) -> Any:
    """One of our samples in slime's ``Sample`` shape.

    Args:
        sample: a ``TrainingSample``, a ``samples.jsonl`` record, our ``InteractionResult`` or an
            ``asolve`` result (see :func:`slime_fields`).
        sample_cls: ``None``: a plain dict (slime's field names; ``status`` a string). A class:
            an instance of it, built with no arguments and filled by :func:`fill_sample` (slime's
            ``Sample`` has defaults for every field). ``"slime"``: slime's own ``Sample``.
        train_statuses, index, group_index: see :func:`slime_fields`.

    Returns:
        The dict, or the ``sample_cls`` instance.

    Raises:
        ImportError: ``sample_cls="slime"`` and slime is not installed.
        TypeError, ValueError: see :func:`slime_fields` and :func:`fill_sample`.
    """
    fields = slime_fields(sample, train_statuses=train_statuses, index=index, group_index=group_index)
    if sample_cls is None:
        return fields
    if sample_cls == "slime":
        sample_cls = slime_sample_class()
        if sample_cls is None:
            raise ImportError("slime is not installed (its Sample is slime.utils.types.Sample); use sample_cls=None for dicts")
    if isinstance(sample_cls, str):
        raise TypeError(f"sample_cls must be None, a class or 'slime', got {sample_cls!r}")
    return fill_sample(sample_cls(), fields)


# -- slime's custom generate function ---------------------------------------------------------------
_STATE_LOCK = threading.Lock()
_CONFIGS: dict[tuple[str | None, tuple[str, ...]], Config] = {}  # (YAML path, overrides) -> config


def _config(args: Any) -> Config:
    """Our config for :func:`generate`: the YAML named by ``args.tau_rollout_config`` (e.g. set by
    slime's ``--custom-config-path``) or the environment variable ``TAU_ROLLOUT_CONFIG``, else
    the defaults, with ``policy.router_url`` set to slime's router (``--sglang-router-ip`` /
    ``--sglang-router-port``); loaded once per process.

    Raises:
        rollout.core.config.ConfigError: a bad YAML value, or no router (neither slime's args nor
            the YAML name one).
    """
    path = getattr(args, "tau_rollout_config", None) or os.environ.get(CONFIG_ENV) or None
    ip, port = getattr(args, "sglang_router_ip", None), getattr(args, "sglang_router_port", None)
    # slime's router is the policy's (generate sends there whatever the YAML says)
    overrides = [f"policy.router_url=http://{ip}:{port}"] if ip and port else []
    with _STATE_LOCK:
        if (path, tuple(overrides)) not in _CONFIGS:
            _CONFIGS[(path, tuple(overrides))] = load_config(path, overrides)
        return _CONFIGS[(path, tuple(overrides))]


def _task_of(sample: Any) -> int | str:
    """The task a slime sample asks for: ``metadata["task_id"]`` (a tau2 id), else
    ``metadata["task_index"]`` (an index into ``env.task_split``), else ``sample.prompt`` as a tau2
    task id (the seed kept its task index there; tau2's ids are strings such as ``"5"``)."""
    meta = getattr(sample, "metadata", None) or {}
    if meta.get("task_id") is not None:
        return str(meta["task_id"])
    if meta.get("task_index") is not None:
        return int(meta["task_index"])
    prompt = getattr(sample, "prompt", None)
    if isinstance(prompt, (int, str)) and str(prompt).strip():
        return str(prompt).strip()
    raise ValueError("the sample names no task: set metadata.task_id (or metadata.task_index), or put the task id in prompt")


async def generate(args: Any, sample: Any, sampling_params: dict[str, Any]) -> Any:
    """slime's custom generate function: one tau2 episode for ``sample``, on our agent.

    Set ``--custom-generate-function-path rollout.integrations.slime.generate`` in place of the seed's
    ``generate_with_tau.generate``. Per process it loads our config once (see :func:`_config`:
    domain, user simulator, ``env.max_steps``, ``rollout.train_statuses``, policy timeouts), the
    domain of ``env.benchmark`` (through the benchmark registry,
    :func:`rollout.integrations.episodes.domain_state`) and its tool sandbox, and runs the episode with :meth:`TrainableAgent.asolve`
    (router from ``args.sglang_router_ip`` / ``sglang_router_port``, tokenizer from
    ``args.hf_checkpoint``, ``args.rollout_max_context_len``, ``sampling_params`` as slime sends
    them; ``max_new_tokens`` is per turn).

    Args:
        args: slime's ``args`` (Namespace).
        sample: slime's ``Sample``: the task is ``metadata["task_id"]``, ``metadata["task_index"]``
            or ``prompt`` (see :func:`_task_of`); ``metadata["domain"]`` overrides ``env.domain``.
        sampling_params: slime's ``sampling_params`` dict.

    Returns:
        ``sample``, filled in place with :func:`slime_fields` (its ``prompt``, ``index``,
        ``group_index`` and ``session_id`` are left as slime set them; a sample that comes back
        from an aborted partial rollout is run again from the start), with
        ``rollout.sample_mode=trajectory`` and ``policy.context_strategy=none`` (one sequence per
        episode, the seed's shape). Otherwise (``per_turn``, ``merge_prefix``, or a context
        strategy that may cut an episode into segments) always a list, in turn order: ``sample``
        first and deep copies of it after, each filled with one of the episode's samples, each
        with the episode's reward. slime's ``generate_and_rm`` takes a list from a custom generate
        function (its comment: "multi-turn agent rollouts that fan out into multiple prefix-chained
        samples"); the shape is the same for every sample of a run, so slime's groups are all
        lists or all samples.

    Raises:
        ValueError, KeyError, IndexError: the sample names no task of the domain, or ``args``
            names no router or tokenizer.
        TemplateError, OSError: the tokenizer cannot be used (see :meth:`TrainableAgent.asolve`).
    """
    cfg = await asyncio.to_thread(_config, args)
    meta = getattr(sample, "metadata", None) or {}
    env_cfg = env_config_for(cfg, meta.get("domain"))
    st = await asyncio.to_thread(domain_state, cfg, env_cfg)  # env.benchmark's domain, through the benchmark registry
    if getattr(sample, "response_length", 0):
        logger.debug("sample %s comes back with %d response tokens (partial rollout): running it from the start",
                     getattr(sample, "index", None), sample.response_length)
    seed = sampling_params.get("sampling_seed")
    env = make_env(st.benchmark, _task_of(sample), env_cfg=env_cfg, seed=int(seed) if seed is not None else 0, executor=st.executor,
                   sandbox=st.sandbox)
    agent = TrainableAgent(policy=cfg.policy)
    res = await agent.asolve(env, args, dict(sampling_params), None, env_cfg.max_steps,
                             episode_id=getattr(sample, "session_id", None) or None,
                             group_id=None if getattr(sample, "group_index", None) is None else str(sample.group_index),
                             sample_index=int(getattr(sample, "index", None) or 0),
                             timeout_s=cfg.pool.episode_timeout_s)
    if cfg.rollout.sample_mode == SampleMode.TRAJECTORY and cfg.policy.context_strategy == "none":  # one sequence: the seed's shape
        return fill_sample(sample, slime_fields(res, train_statuses=cfg.rollout.train_statuses), skip=_IDENTITY)
    parts = get_exporter(cfg.rollout.sample_mode, keep_messages=cfg.rollout.keep_messages).split(res.to_sample())
    out = [sample] + [copy.deepcopy(sample) for _ in parts[1:]]
    for target, part in zip(out, parts):
        fill_sample(target, slime_fields(part, train_statuses=cfg.rollout.train_statuses), skip=_IDENTITY)
    return out
