"""The user simulator's side that both tau adapters share (tau2's, :mod:`rollout.benchmarks.tau2`,
and the original tau-bench's, :mod:`rollout.benchmarks.tau_bench`): stop signals, one user turn
(:class:`UserReply`), the user's own tools in a dual-control domain (:class:`UserTools`), the
:class:`UserSimulator` protocol, the API key ``env.user`` names (:func:`user_api_key`), the
scripted users' answering rule (:func:`scripted_answer`) and the check of an llm user's endpoint
(:func:`check_user_simulator`, both benchmarks' ``check_user`` hook).

Stop signals are tau2's: ``###STOP###``, ``###TRANSFER###``, ``###OUT-OF-SCOPE###`` (tau-bench's
users stop with ``###STOP###`` too).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol

from rollout.benchmarks.user_retry import classify_failure, one_line
from rollout.core.config import UserConfig
from rollout.core.environment import UserSimulatorError

logger = logging.getLogger(__name__)

STOP, TRANSFER, OUT_OF_SCOPE = "###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"
STOP_SIGNALS = (STOP, TRANSFER, OUT_OF_SCOPE)
# tau2's LLM agent opens every conversation with this greeting; the user simulator answers it.
AGENT_GREETING = "Hi! How can I help you today?"


@dataclass(frozen=True)
class UserReply:
    """One user turn. ``stop`` is True when the user ended the conversation (``text`` keeps the signal)."""

    text: str
    stop: bool

    @property
    def transfer(self) -> bool:
        return TRANSFER in self.text


def is_stop(text: str) -> bool:
    """Whether ``text`` holds one of the :data:`STOP_SIGNALS`."""
    return any(s in text for s in STOP_SIGNALS)


@dataclass(frozen=True)
class UserTools:
    """The user's own tools in a dual-control domain (tau2 telecom), handed to the user simulator
    by the environment (``bind_tools``) before the conversation starts.

    Attributes:
        schemas: OpenAI-style function schemas of the user's tools (tau2's
            ``Environment.get_user_tools()``).
        call: ``await call(name, arguments) -> (content, error)``: runs one tool call in the
            user's side of the episode's environment (off the event loop, bounded; see
            :meth:`rollout.benchmarks.tau2.episode.Tau2Environment._user_tool`), records it for tau2's
            evaluator and returns tau2's tool message content and whether it is an error. It
            raises ``EnvironmentStepError`` when the environment fails (the episode then ends
            ``env_error``).
    """

    schemas: tuple[dict, ...]
    call: Callable[[str, dict], Awaitable[tuple[str, bool]]]

    @property
    def names(self) -> list[str]:
        """The tool names, in schema order."""
        return [s["function"]["name"] for s in self.schemas]


class UserSimulator(Protocol):
    """One simulated user for one episode. In a dual-control domain the environment first calls
    the simulator's ``bind_tools(tools: UserTools)`` (simulators without it cannot serve such
    domains: the episode ends ``user_error``)."""

    async def start(self) -> str:
        """Return the user's opening message."""
        ...

    async def respond(self, agent_message: str) -> UserReply:
        """Answer the agent's text message."""
        ...


def user_api_key(cfg: UserConfig) -> str:
    """The API key named by ``cfg.api_key_env`` ("" when no variable is configured).

    Raises:
        UserSimulatorError: the variable is configured but unset or empty.
    """
    if not cfg.api_key_env:
        return ""
    key = os.environ.get(cfg.api_key_env, "")
    if not key.strip():
        raise UserSimulatorError(f"environment variable {cfg.api_key_env} (env.user.api_key_env) is not set or empty")
    return key


def scripted_answer(agent_message: str | None, answers: int, max_answers: int, info: str) -> str | None:
    """The scripted users' rule (tau2's :class:`~rollout.benchmarks.tau2.scripted_user.ScriptedUser`
    and tau-bench's :class:`~rollout.benchmarks.tau_bench.environment.ScriptedTauBenchUser`; the
    local stack's gold replay counts on it): ``info`` and ``"Yes, please go ahead."`` to an agent
    message that asks something (holds ``?``), while fewer than ``max_answers`` answers were given;
    None (stop) otherwise. The caller counts the answers."""
    if "?" not in (agent_message or "") or answers >= max_answers:
        return None
    return f"{info}\nYes, please go ahead."


# -- the llm user's endpoint, checked before any episode -------------------------------------------
#: Bound, in seconds, on the one-time loads before a process's first user-simulator call (tau2's
#: guidelines file and ``import litellm``). It is not ``env.user.timeout_s``, which bounds one
#: call: the import takes about 2 s on an idle machine, and on a 2-core CI runner under the test
#: suite's load (40-66) it was measured at over 5 s and once at over 60 s, so a tight per-call
#: timeout must not fail the first episode of every process. The bound is there for a load that
#: hangs (litellm reaching for the network), not for a slow one.
LOAD_TIMEOUT_S = 300.0


def import_litellm() -> Any:
    """litellm, imported with the settings the user simulators use (about 2 s and 100 MB the first
    time in a process: call it in a thread then): its cost map read locally, and no "Give
    Feedback / Get Help" banner on stdout for every exception (our own WARNING per retry says what
    happened)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    return litellm


def _key_source(cfg: UserConfig) -> str:
    return f"the API key from ${cfg.api_key_env}" if cfg.api_key_env else "the request (no API key configured: env.user.api_key_env is null)"


async def check_user_simulator(cfg: UserConfig, timeout_s: float = 10.0) -> None:
    """Check, before any episode, that the configured user simulator can work (the ``check_user``
    hook of both tau benchmarks: tau-bench's llm user calls the same kind of endpoint, through
    litellm's ``openai`` provider).

    For ``kind == "scripted"`` it returns at once. For ``kind == "llm"`` it checks that
    ``base_url`` and ``model`` are set, that the variable named by ``api_key_env`` (if any) holds
    a key, and that the endpoint answers and accepts the key: ``GET {base_url}/models`` with the
    key; when that path is not served (any answer but 2xx, 401 or 403), a one-token chat
    completion for ``model`` instead. No retries: a failure is reported at once.

    Async: from synchronous code (a CLI's pre-flight) call ``asyncio.run(check_user_simulator(cfg))``.

    Args:
        cfg: the ``env.user`` section, with ``base_url`` resolved (e.g. to the local router's ``/v1``).
        timeout_s: bound on each request, in seconds (a dead endpoint fails within about this).

    Raises:
        UserSimulatorError: one line saying what is wrong (the key variable missing or empty, the
            endpoint not answering, the key rejected with 401/403, the test completion failing);
            it never contains the key.
        ValueError: unknown ``cfg.kind``.
    """
    if cfg.kind == "scripted":
        return
    if cfg.kind != "llm":
        raise ValueError(f"env.user.kind: unknown user simulator {cfg.kind!r}")
    if not cfg.base_url or not cfg.model:
        raise UserSimulatorError("env.user.base_url and env.user.model are required for the llm user simulator")
    key = user_api_key(cfg)
    await check_endpoint(cfg, key, who="user simulator", key_source=_key_source(cfg), error=UserSimulatorError, timeout_s=timeout_s)


async def check_endpoint(cfg: Any, key: str, *, who: str, key_source: str, error: type[Exception], timeout_s: float = 10.0) -> None:
    """Check that an OpenAI-compatible endpoint answers and accepts ``key`` (the llm user
    simulator's, the NL-assertion judge's): ``GET {cfg.base_url}/models``; when that path is not
    served (any answer but 2xx, 401 or 403), a one-token chat completion for ``cfg.model``.

    Args:
        cfg: a section with ``base_url`` and ``model`` (``env.user``, ``env.judge``).
        key: the API key ("" for none).
        who: what the endpoint serves, for the messages (``user simulator``, ``NL-assertion judge``).
        key_source: where the key comes from, for the messages.
        error: the exception type raised.
        timeout_s: bound on each request, in seconds.

    Raises:
        error: one line saying what is wrong; it never contains the key.
    """
    import aiohttp

    base = cfg.base_url.rstrip("/")
    url = f"{base}/models"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            async with session.get(url, headers={"Authorization": f"Bearer {key or 'EMPTY'}"}) as resp:
                status = resp.status
                body = await resp.read()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        what = f"no answer within {timeout_s:g}s" if isinstance(e, asyncio.TimeoutError) else one_line(f"{type(e).__name__}: {e}", key, 200)
        raise error(f"{who} endpoint {base} does not answer (GET /models: {what})") from None
    if status in (401, 403):
        raise error(f"{who} endpoint {base} rejected {key_source} (GET /models: HTTP {status})")
    if 200 <= status < 300:
        try:
            ids = [m.get("id") for m in json.loads(body).get("data", [])]
        except Exception:
            ids = []
        if ids and cfg.model not in ids:
            logger.warning("%s endpoint %s does not list model %r (it lists %s)", who, base, cfg.model, ids[:5])
        return
    await _probe_chat(cfg, key, base, timeout_s, why=f"GET /models answered HTTP {status}", who=who, key_source=key_source, error=error)


async def _probe_chat(cfg: Any, key: str, base: str, timeout_s: float, why: str, *, who: str, key_source: str, error: type[Exception]) -> None:
    """A one-token chat completion; raises ``error`` (one line) when it fails."""
    bound = max(timeout_s, LOAD_TIMEOUT_S)
    try:
        litellm = await asyncio.wait_for(asyncio.to_thread(import_litellm), bound)
    except asyncio.TimeoutError:
        raise error(f"importing litellm took over {bound:g}s") from None
    try:
        await asyncio.wait_for(
            litellm.acompletion(
                model=f"openai/{cfg.model}", api_base=cfg.base_url, api_key=key or "EMPTY",
                messages=[{"role": "user", "content": "ping"}], max_tokens=1, temperature=0.0,
                num_retries=0, max_retries=0,
            ),
            timeout=timeout_s,
        )
    except asyncio.TimeoutError:
        raise error(f"{who} endpoint {base} does not answer ({why}; a test chat completion had no answer within {timeout_s:g}s)") from None
    except Exception as e:
        f = classify_failure(e, key, litellm)
        if f.status in (401, 403):
            raise error(f"{who} endpoint {base} rejected {key_source} (test chat completion: HTTP {f.status})") from None
        if f.status is None and f.transient:
            raise error(f"{who} endpoint {base} does not answer ({why}; test chat completion: {f.summary})") from None
        raise error(f"{who} endpoint {base} failed a test chat completion for model {cfg.model!r} ({why}; {f.summary})") from None
