"""Checks run before any episode: each fails fast with ONE clear line.

A run that starts against a router nobody listens on, a model served with another tokenizer, or
an output folder it cannot write, otherwise fails late (minutes of retries and a flood of logs)
or, worse, trains on token ids that mean something else. :func:`run_preflight` runs, in order:

1. :func:`check_router` (only when ``policy.router_url`` is set): the router answers, lists at
   least one healthy worker, and serves a model; returns the model info.
2. :func:`check_tokenizer`: ``policy.tokenizer`` loads, and matches the served model's tokenizer
   as far as the server reports it (vocabulary size, the chat template's special tokens, EOS).
3. :func:`check_output_dir`: ``rollout.output_dir`` can be created and written.
4. An optional user-simulator check (a callable taking ``cfg.env.user``, sync or async).

Each raises :class:`PreflightError` (a ``RuntimeError``) whose message is one line.

What servers report (``GET /model_info``; ``/get_model_info`` is the older, deprecated name):

* SGLang reports ``model_path``, ``tokenizer_path``, ``is_generation``,
  ``preferred_sampling_params``, ``weight_version`` and, in recent versions,
  ``has_image_understanding``, ``has_audio_understanding``, ``model_type``, ``architectures``.
  It reports no vocabulary size and no special tokens; then only what is there is compared and
  the rest is logged at INFO as not checked.
* The project's local server (:mod:`rollout.devtools.local.server`) reports the same keys plus
  ``tokenizer_vocab_size`` (``len(tokenizer)``, added tokens included), ``eos_token_id`` and
  ``special_tokens`` (``{token: id}`` for the added tokens its chat template uses), which
  :func:`check_tokenizer` compares.
* sglang-router 0.3.2 proxies ``GET /get_model_info`` to one worker (forwarding the client's
  ``Authorization`` header) but answers 404 to ``GET /model_info``; the check tries the router's
  ``/get_model_info`` and ``/model_info``, then a healthy worker's ``/model_info`` and
  ``/get_model_info`` directly.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollout.core.config import Config

logger = logging.getLogger(__name__)

_BODY_SNIPPET = 160


class PreflightError(RuntimeError):
    """A preflight check failed; the message is one line naming what and where."""


def _one_line(text: str, limit: int = _BODY_SNIPPET) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------- tokenizer facts
def chat_template_special_tokens(tokenizer) -> dict[str, int]:
    """The added tokens that the tokenizer's chat template writes, as ``{token text: id}``.

    These are the tokens whose ids must agree between the client (which renders prompts) and the
    server (which samples them): for Qwen3 ``<|im_start|>``, ``<|im_end|>``, ``<think>``,
    ``</think>``, ``<tool_call>``, ``</tool_call>``, ``<tool_response>``, ``</tool_response>``.

    Args:
        tokenizer: a ``transformers`` tokenizer (its ``added_tokens_decoder`` and
            ``chat_template``, a string or a dict of named templates).

    Returns:
        The mapping, sorted by id; empty when the tokenizer has no chat template.
    """
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = "\n".join(str(t) for t in template.values())
    elif isinstance(template, list):  # [{"name": ..., "template": ...}] in some configs
        template = "\n".join(str(t.get("template", "")) if isinstance(t, dict) else str(t) for t in template)
    if not template:
        return {}
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    found = {str(getattr(tok, "content", tok)): int(i) for i, tok in decoder.items()
             if str(getattr(tok, "content", tok)) and str(getattr(tok, "content", tok)) in template}
    return dict(sorted(found.items(), key=lambda kv: kv[1]))


def _eos_ids(tokenizer) -> list[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else sorted(int(e) for e in eos)


def tokenizer_facts(tokenizer) -> dict[str, Any]:
    """What a server reports about its tokenizer, so that clients can compare (see module doc).

    Returns:
        ``{"tokenizer_vocab_size": int (len(tokenizer), added tokens included), "eos_token_id":
        int | list[int] | None, "special_tokens": {token: id}}``.
    """
    eos = _eos_ids(tokenizer)
    return {
        "tokenizer_vocab_size": len(tokenizer),
        "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
        "special_tokens": chat_template_special_tokens(tokenizer),
    }


# --------------------------------------------------------------------------- HTTP
def _get(url: str, api_key: str | None, timeout: float) -> tuple[int, Any]:
    """``(status, parsed JSON or raw text)``; raises ``OSError`` (refused, timeout, DNS)."""
    req = urllib.request.Request(url, method="GET")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=max(0.05, timeout)) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    text = raw.decode("utf-8", errors="replace")
    try:
        return status, json.loads(text) if text.strip() else None
    except ValueError:
        return status, text


def _reason(e: BaseException) -> str:
    if isinstance(e, urllib.error.URLError) and e.reason is not None:
        e = e.reason if isinstance(e.reason, BaseException) else OSError(str(e.reason))
    if isinstance(e, (socket.timeout, TimeoutError)):
        return "no answer (timed out)"
    if isinstance(e, ConnectionRefusedError):
        return "connection refused (nothing listens there)"
    return _one_line(f"{type(e).__name__}: {e}")


def check_router(router_url: str, api_key: str | None, timeout_s: float = 5.0) -> dict:
    """The router answers, lists at least one healthy worker, and serves a model.

    Args:
        router_url: ``http(s)://host:port`` of the SGLang router (or of a single SGLang server).
        api_key: sent as ``Authorization: Bearer <key>``; None: no header.
        timeout_s: seconds for the whole check (every request shares this deadline).

    Returns:
        The model info of the served model (``GET /get_model_info`` or ``/model_info``: at least
        ``model_path``; see the module docstring for the other keys).

    Raises:
        PreflightError: nothing answers within ``timeout_s``, the key is refused (401/403), the
            router lists no healthy worker, or no model info can be had. One line.
    """
    base = router_url.rstrip("/")
    deadline = time.monotonic() + timeout_s
    where = f"router {base}"

    def left() -> float:
        rest = deadline - time.monotonic()
        if rest <= 0:
            raise PreflightError(f"{where}: no complete answer within {timeout_s:g} s (policy.router_url)")
        return rest

    def get(url: str) -> tuple[int, Any]:
        try:
            return _get(url, api_key, left())
        except PreflightError:
            raise
        except (OSError, ValueError) as e:  # URLError, refused, timeout, bad URL
            raise PreflightError(f"{where}: GET {url[len(base):] or '/'} failed: {_reason(e)} (policy.router_url)") from None

    def refused(status: int, path: str) -> PreflightError:
        hint = "no key was sent: set policy.api_key_env" if not api_key else "check the key in policy.api_key_env"
        return PreflightError(f"{where}: GET {path} refused with HTTP {status} ({hint})")

    # 1. the router answers and lists its workers
    status, body = get(base + "/workers")
    workers: list[dict] | None = None
    if status in (401, 403):
        raise refused(status, "/workers")
    if status == 200 and isinstance(body, dict) and isinstance(body.get("workers"), list):
        workers = [w for w in body["workers"] if isinstance(w, dict)]
    else:  # not an sglang-router (a single server?): it must at least be healthy
        status_h, _ = get(base + "/health")
        if status_h != 200:
            raise PreflightError(f"{where}: GET /workers answered HTTP {status} and GET /health HTTP {status_h}")
        logger.info("%s: GET /workers answered HTTP %s (not an sglang-router?); worker count not checked", where, status)
    healthy: list[str] = []
    if workers is not None:
        if not workers:
            raise PreflightError(f"{where}: lists no workers (GET /workers); start the SGLang servers or register them")
        healthy = [str(w.get("url", "")).rstrip("/") for w in workers if w.get("is_healthy", True)]
        if not healthy:
            urls = ", ".join(str(w.get("url")) for w in workers)
            raise PreflightError(f"{where}: none of its {len(workers)} workers is healthy ({_one_line(urls)})")

    # 2. the served model
    tried: list[str] = []
    candidates = [base + "/get_model_info", base + "/model_info"]
    candidates += [u + p for u in healthy[:1] if u for p in ("/model_info", "/get_model_info")]
    for url in candidates:
        status, body = get(url)
        if status in (401, 403):
            raise refused(status, url[len(base):] if url.startswith(base) else url)
        if status == 200 and isinstance(body, dict) and body.get("model_path"):
            if body.get("is_generation") is False:
                raise PreflightError(f"{where}: serves {body['model_path']!r}, which is not a generation model (is_generation false)")
            logger.info("%s: %d healthy worker(s), model %s (weight_version %s)", where, len(healthy),
                        body.get("model_path"), body.get("weight_version"))
            return body
        tried.append(f"{url} -> HTTP {status}")
    raise PreflightError(f"{where}: serves no model info ({_one_line('; '.join(tried), 300)})")


def check_tokenizer(model_info: dict, tokenizer) -> None:
    """The served model's tokenizer matches ``policy.tokenizer`` as far as the server reports it.

    Compared when reported: ``tokenizer_vocab_size`` (``len(tokenizer)``), the chat template's
    special tokens (``special_tokens``: every token the client's template writes must have the
    same id on the server) and ``eos_token_id``. A server reporting only ``vocab_size`` (the
    model's embedding rows, usually padded) is checked for ``len(tokenizer) <= vocab_size``.
    What the server does not report (real SGLang reports none of these) is logged at INFO.

    Args:
        model_info: what :func:`check_router` returned.
        tokenizer: a loaded ``transformers`` tokenizer, or a ``policy.tokenizer`` name loaded with
            :func:`rollout.core.tokenizer.load_tokenizer`.

    Raises:
        PreflightError: a mismatch (the message names both values), or the tokenizer does not
            load. One line.
    """
    name = tokenizer if isinstance(tokenizer, str) else getattr(tokenizer, "name_or_path", "?")
    if isinstance(tokenizer, str):
        from rollout.core.tokenizer import load_tokenizer

        try:
            tokenizer = load_tokenizer(tokenizer)
        except Exception as e:  # noqa: BLE001  (any load failure is one preflight line)
            raise PreflightError(f"policy.tokenizer {name!r} does not load: {_one_line(f'{type(e).__name__}: {e}')}") from None
    ours = tokenizer_facts(tokenizer)
    model = model_info.get("model_path", "?")
    unchecked: list[str] = []

    n_srv = model_info.get("tokenizer_vocab_size")
    if isinstance(n_srv, int):
        if n_srv != ours["tokenizer_vocab_size"]:
            raise PreflightError(
                f"tokenizer mismatch: the served model {model!r} has a tokenizer of {n_srv} tokens, "
                f"policy.tokenizer {name!r} has {ours['tokenizer_vocab_size']}"
            )
    elif isinstance(model_info.get("vocab_size"), int):
        if ours["tokenizer_vocab_size"] > model_info["vocab_size"]:
            raise PreflightError(
                f"tokenizer mismatch: the served model {model!r} has a vocabulary of {model_info['vocab_size']} ids, "
                f"policy.tokenizer {name!r} has {ours['tokenizer_vocab_size']} tokens"
            )
        unchecked.append("exact tokenizer size (only the model's vocab_size is reported)")
    else:
        unchecked.append("vocabulary size")

    specials = model_info.get("special_tokens")
    if isinstance(specials, dict):
        bad = [f"{tok!r}: {specials.get(tok)} vs {tid}" for tok, tid in ours["special_tokens"].items() if specials.get(tok) != tid]
        if bad:
            raise PreflightError(
                f"tokenizer mismatch: chat-template special tokens differ between the served model {model!r} and "
                f"policy.tokenizer {name!r} (server vs ours): {_one_line(', '.join(bad), 300)}"
            )
    else:
        unchecked.append("chat-template special tokens")

    eos_srv = model_info.get("eos_token_id")
    if eos_srv is not None:
        srv = sorted(eos_srv) if isinstance(eos_srv, list) else [eos_srv]
        if srv != _eos_ids(tokenizer):
            raise PreflightError(
                f"tokenizer mismatch: the served model {model!r} has eos_token_id {eos_srv}, "
                f"policy.tokenizer {name!r} has {ours['eos_token_id']}"
            )
    else:
        unchecked.append("EOS id")

    if unchecked:
        logger.info("tokenizer check: the server (model %s, tokenizer_path %s) does not report %s; not checked "
                    "(make sure policy.tokenizer %r is the served model's tokenizer)",
                    model, model_info.get("tokenizer_path"), ", ".join(unchecked), name)
    else:
        logger.info("tokenizer check: %s matches the served model %s (%d tokens, %d template tokens)",
                    name, model, ours["tokenizer_vocab_size"], len(ours["special_tokens"]))


def check_output_dir(path: str | os.PathLike) -> None:
    """``path`` can be created (with its parents) and written: a probe file is written and removed.

    Raises:
        PreflightError: the folder cannot be created or written. One line.
    """
    p = Path(path).expanduser()
    probe = p / f".preflight-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        p.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as fh:
            fh.write(b"ok")
            fh.flush()
            os.fsync(fh.fileno())
        probe.unlink()
    except OSError as e:
        raise PreflightError(f"rollout.output_dir {str(p)!r} is not writable: {type(e).__name__}: {e.strerror or e}") from None
    finally:
        try:
            probe.unlink()
        except OSError:
            pass


def _run_check(fn: Callable[[Any], Any], arg: Any, timeout_s: float) -> Any:
    """Call ``fn(arg)``; await the result when it is awaitable (in a fresh event loop, in a helper
    thread when this thread already runs one), at most ``timeout_s`` seconds."""
    result = fn(arg)
    if not inspect.isawaitable(result):
        return result

    async def bounded() -> Any:
        return await asyncio.wait_for(result, timeout_s)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(bounded())
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = asyncio.run(bounded())
        except BaseException as e:  # noqa: BLE001  (re-raised in the caller's thread)
            box["error"] = e

    t = threading.Thread(target=run, name="preflight-user-check", daemon=True)
    t.start()
    t.join(timeout_s + 5.0)
    if t.is_alive():
        raise TimeoutError(f"no answer within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def check_key_variables(cfg: Config) -> None:
    """The variables named by ``policy.api_key_env`` and (for the llm user) ``env.user.api_key_env``
    are set and not empty; cheap, so the CLI runs it before starting anything.

    Raises:
        PreflightError: naming the key and the variable (never a value).
    """
    user_var = cfg.env.user.api_key_env if cfg.env.user.kind == "llm" else None
    for var, key in ((cfg.policy.api_key_env, "policy.api_key_env"), (user_var, "env.user.api_key_env")):
        if var and not os.environ.get(var):
            raise PreflightError(f"{key} names the environment variable {var}, which is not set (or empty)")


def check_benchmark(cfg: Config) -> None:
    """With ``env.benchmark: tau_bench``, the original tau-bench's package ``tau_bench`` can be
    imported (looked up, not imported: milliseconds); the CLI runs it before starting anything.

    Raises:
        PreflightError: one line with the install command (``rollout.benchmarks.tau_bench.environment.INSTALL_COMMAND``).
    """
    if getattr(cfg.env, "benchmark", "tau2") != "tau_bench":
        return
    from rollout.benchmarks.tau_bench.environment import TauBenchNotInstalled, require_tau_bench

    try:
        require_tau_bench()
    except TauBenchNotInstalled as e:
        raise PreflightError(str(e)) from None


def check_modules(cfg: Config) -> None:
    """The optional packages the config asks for can be imported here (looked up, not imported):
    ``torch`` for ``local.backend=tiny`` (the ``tiny`` extra) with ``local.enabled``; ``litellm``
    for ``env.user.kind=llm``. (``pool.event_loop=uvloop`` is checked on the actors' nodes, by the
    pool once they are up.)

    Raises:
        PreflightError: one line naming the key and the install command.
    """
    if cfg.local.enabled and cfg.local.backend == "tiny" and not _importable("torch"):
        raise PreflightError("local.backend=tiny needs torch, which is not installed here: pip install 'tau-rollout[tiny]' "
                             "(torch==2.13.0 is the CPU build), or choose local.backend=gold_replay")
    if cfg.env.user.kind == "llm" and not _importable("litellm"):
        raise PreflightError("env.user.kind=llm needs litellm, which is not installed here: pip install litellm")


def _importable(module: str) -> bool:
    """Whether ``module`` can be imported (found on the path and not masked in ``sys.modules``)."""
    import importlib.util
    import sys

    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_tokenizer_loads(name: str) -> None:
    """``policy.tokenizer`` names something loadable (:func:`rollout.core.tokenizer.check_tokenizer_source`:
    no network wait for a hub id that is neither cached nor reachable), and it loads, before
    anything is started (loaded once per process and cached: the preflight's comparison with the
    served tokenizer, :func:`check_tokenizer`, reuses it).

    Raises:
        PreflightError: one line naming ``policy.tokenizer``, what was tried and what to pass instead.
    """
    from rollout.core.tokenizer import TokenizerSourceError, check_tokenizer_source, load_tokenizer

    try:
        check_tokenizer_source(name)
    except TokenizerSourceError as e:
        raise PreflightError(str(e)) from None
    try:
        load_tokenizer(name)
    except Exception as e:  # noqa: BLE001  (any load failure is one line)
        raise PreflightError(f"policy.tokenizer={name} does not load: {_one_line(f'{type(e).__name__}: {e}', 300)}; "
                             "pass builtin:qwen3 or a local folder with a chat model's tokenizer files") from None


# How long check_ray_address waits for a named Ray cluster to accept a connection (seconds): a
# head started just before the job (`ray start --head` in the same script) takes a few seconds to
# listen; ray.init itself waits for minutes on an address where nothing ever will.
RAY_ADDRESS_WAIT_S = 20.0


def check_ray_address(address: str | None, timeout_s: float = RAY_ADDRESS_WAIT_S) -> None:
    """``pool.ray_address`` (or ``RAY_ADDRESS`` when it is null) answers, when it names a cluster
    by ``host:port`` or ``ray://host:port``: a TCP connection to it opens within ``timeout_s``
    (tried every half second, for a head that is still starting). ``None``, ``auto`` and
    ``local`` are left to Ray (``auto`` fails at once when no cluster runs).

    Raises:
        PreflightError: one line naming the key, the address and what to do.
    """
    key = "pool.ray_address"
    if address is None:
        address, key = os.environ.get("RAY_ADDRESS") or None, "RAY_ADDRESS (pool.ray_address is null)"
    if address is None or address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[1] if "://" in address else address
    host, _, port = hostport.rstrip("/").rpartition(":")
    if not host or not port.isdigit():
        raise PreflightError(f"{key}={address}: not an address of the form host:port or ray://host:port "
                             "(or null, auto, local)")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
                return
        except OSError as e:
            if time.monotonic() + 0.5 >= deadline:
                raise PreflightError(f"{key}={address}: nothing answered there within {timeout_s:g} s ({_reason(e)}); start the "
                                     "cluster (ray start --head) or set pool.ray_address=local for a new local one") from None
        time.sleep(0.5)


def check_before_start(cfg: Config) -> None:
    """Every check that needs nothing started, in order, so that a bad value fails in seconds
    with one line before the local stack, Ray or any actor starts: the key variables, the
    benchmark's package, optional packages (:func:`check_modules`), ``pool.ray_address``, the
    tokenizer (:func:`check_tokenizer_loads`) and ``rollout.output_dir``
    (:func:`check_output_dir`). What needs the router (its workers, the served tokenizer) and the
    user simulator's endpoint is checked by :func:`run_preflight`, once they are up.

    Raises:
        PreflightError: the first check that fails, one line.
    """
    check_key_variables(cfg)
    check_benchmark(cfg)
    check_modules(cfg)
    check_ray_address(cfg.pool.ray_address)
    check_tokenizer_loads(cfg.policy.tokenizer)
    check_output_dir(cfg.rollout.output_dir)


def run_preflight(cfg: Config, check_user: Callable[[Any], Any] | None = None, *,
                  router_timeout_s: float = 5.0, user_timeout_s: float = 30.0) -> dict:
    """Run the checks in order: the key variables and the benchmark's package
    (:func:`check_benchmark`), router and tokenizer (when ``policy.router_url`` is set; else
    only that the tokenizer loads), output folder, then ``check_user(cfg.env.user)``.

    Args:
        cfg: the whole config; the key is read from the environment variable named by
            ``policy.api_key_env``.
        check_user: optional user-simulator check, e.g. ``rollout.benchmarks.tau2.user.check_user_simulator``;
            called with ``cfg.env.user``, sync or async; it raises to fail.
        router_timeout_s: seconds for :func:`check_router`.
        user_timeout_s: seconds for ``check_user``.

    Returns:
        ``{"model_info": dict | None, "output_dir": str, "user": what check_user returned or
        None, "seconds": float}``.

    Raises:
        PreflightError: the first check that fails, one line.
    """
    t0 = time.monotonic()
    out: dict[str, Any] = {"model_info": None, "output_dir": cfg.rollout.output_dir, "user": None}
    check_key_variables(cfg)
    check_benchmark(cfg)
    api_key = os.environ.get(cfg.policy.api_key_env) if cfg.policy.api_key_env else None
    if cfg.policy.router_url:
        out["model_info"] = check_router(cfg.policy.router_url, api_key, timeout_s=router_timeout_s)
        check_tokenizer(out["model_info"], cfg.policy.tokenizer)
    else:
        check_tokenizer_loads(cfg.policy.tokenizer)
        logger.info("preflight: policy.router_url is not set; router and tokenizer match not checked")
    check_output_dir(cfg.rollout.output_dir)
    if check_user is not None:
        try:
            out["user"] = _run_check(check_user, cfg.env.user, user_timeout_s)
        except PreflightError:
            raise
        except Exception as e:  # noqa: BLE001  (any failure is one line)
            where = cfg.env.user.base_url or cfg.env.user.kind
            raise PreflightError(f"user simulator ({where}): {_one_line(f'{type(e).__name__}: {e}', 300)}") from None
    out["seconds"] = round(time.monotonic() - t0, 3)
    logger.info("preflight passed in %.2f s", out["seconds"])
    return out
