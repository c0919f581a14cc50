"""Preflight checks: each fails within seconds with one clear line.

Against the real local stack (``retail_stack``) they pass; mismatches come from a small fake
router on 127.0.0.1 (aiohttp in a background thread) that reports what a test wants.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from contextlib import contextmanager

import pytest
from aiohttp import web

from rollout.app.preflight import (
    PreflightError,
    chat_template_special_tokens,
    check_output_dir,
    check_router,
    check_tokenizer,
    run_preflight,
)
from rollout.core.config import Config
from rollout.devtools.local.stack import free_port


@contextmanager
def fake_router(model_info: dict | None, workers: list[dict] | None = None, require_key: str | None = None):
    """A fake sglang-router on 127.0.0.1: ``GET /workers`` lists ``workers`` (default: itself,
    healthy) and ``GET /get_model_info`` answers ``model_info`` (None: 404). Yields its URL."""
    loop = asyncio.new_event_loop()
    port = free_port()
    url = f"http://127.0.0.1:{port}"

    @web.middleware
    async def auth(request, handler):
        if require_key and request.headers.get("Authorization") != f"Bearer {require_key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    async def list_workers(request):
        ws = [{"url": url, "is_healthy": True, "load": 0}] if workers is None else workers
        return web.json_response({"workers": ws, "total": len(ws)})

    async def info(request):
        if model_info is None:
            return web.Response(status=404)
        return web.json_response(model_info)

    app = web.Application(middlewares=[auth])
    app.add_routes([web.get("/workers", list_workers), web.get("/get_model_info", info),
                    web.get("/health", lambda r: web.Response(status=200))])
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield url
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _one_line(e: BaseException) -> str:
    msg = str(e)
    assert "\n" not in msg, msg
    return msg


def _cfg(tmp_path, router_url: str | None, **policy) -> Config:
    cfg = Config()
    cfg.policy.router_url = router_url
    for k, v in policy.items():
        setattr(cfg.policy, k, v)
    cfg.rollout.output_dir = str(tmp_path / "out")
    return cfg


# --------------------------------------------------------------------------- the real local stack
@pytest.mark.slow
def test_checks_pass_against_the_local_stack(retail_stack, tokenizer, tmp_path):
    info = check_router(retail_stack.router_url, None)
    assert info["model_path"] and info["is_generation"] is True and "weight_version" in info
    assert info["tokenizer_vocab_size"] == len(tokenizer)
    assert info["special_tokens"] == chat_template_special_tokens(tokenizer)
    assert {"<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"} <= set(info["special_tokens"])
    assert info["eos_token_id"] == tokenizer.eos_token_id
    check_tokenizer(info, "builtin:qwen3")
    check_tokenizer(info, tokenizer)

    seen = []

    async def check_user(user_cfg):
        seen.append(user_cfg)
        return "user ok"

    out = run_preflight(_cfg(tmp_path, retail_stack.router_url), check_user=check_user)
    assert out["model_info"]["model_path"] == info["model_path"]
    assert out["user"] == "user ok" and len(seen) == 1
    assert os.path.isdir(tmp_path / "out") and not os.listdir(tmp_path / "out")  # the probe is gone
    assert isinstance(out["seconds"], float) and out["seconds"] >= 0  # reported; its speed is python -m rollout.bench startup's


# --------------------------------------------------------------------------- router failures
def test_nothing_listening_fails_fast_with_one_line(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(PreflightError) as e:
        check_router(url, None)
    msg = _one_line(e.value)
    assert url in msg and "refused" in msg  # the refusal itself, not a timeout waited out
    with pytest.raises(PreflightError) as e:
        run_preflight(_cfg(tmp_path, url))
    assert "refused" in _one_line(e.value)


def test_a_router_that_never_answers_fails_within_the_timeout():
    with socket.socket() as s:  # accepts connections (kernel backlog) but never answers
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        with pytest.raises(PreflightError) as e:
            check_router(url, None, timeout_s=1.0)
        msg = _one_line(e.value)
        assert "timed out" in msg or "no complete answer within 1 s" in msg  # the check's own bound cut it


def test_router_without_healthy_workers_or_model_fails():
    with fake_router({"model_path": "m"}, workers=[]) as url, pytest.raises(PreflightError, match="lists no workers"):
        check_router(url, None)
    bad = [{"url": "http://127.0.0.1:1", "is_healthy": False}]
    with fake_router({"model_path": "m"}, workers=bad) as url, pytest.raises(PreflightError, match="none of its 1 workers"):
        check_router(url, None)
    with fake_router(None) as url, pytest.raises(PreflightError, match="serves no model info") as e:
        check_router(url, None)
    _one_line(e.value)


def test_refused_key_names_the_config_key(tmp_path, monkeypatch):
    with fake_router({"model_path": "m"}, require_key="right") as url:
        with pytest.raises(PreflightError, match="HTTP 401.*policy.api_key_env") as e:
            check_router(url, None)
        _one_line(e.value)
        with pytest.raises(PreflightError, match="HTTP 401"):
            check_router(url, "wrong")
        assert check_router(url, "right")["model_path"] == "m"
        monkeypatch.setenv("ROLLOUT_TEST_PREFLIGHT_KEY", "right")
        info = {"model_path": "m"}
        assert run_preflight(_cfg(tmp_path, url, api_key_env="ROLLOUT_TEST_PREFLIGHT_KEY"))["model_info"] == info
        monkeypatch.delenv("ROLLOUT_TEST_PREFLIGHT_KEY")
        with pytest.raises(PreflightError, match="ROLLOUT_TEST_PREFLIGHT_KEY, which is not set"):
            run_preflight(_cfg(tmp_path, url, api_key_env="ROLLOUT_TEST_PREFLIGHT_KEY"))


# --------------------------------------------------------------------------- tokenizer
def test_vocab_size_mismatch_names_both_sizes(tokenizer, tmp_path):
    info = {"model_path": "other-model", "is_generation": True, "tokenizer_vocab_size": 1000}
    with fake_router(info) as url:
        got = check_router(url, None)
        assert got == info
        with pytest.raises(PreflightError) as e:
            check_tokenizer(got, "builtin:qwen3")
        msg = _one_line(e.value)
        assert "1000" in msg and str(len(tokenizer)) in msg and "other-model" in msg
        with pytest.raises(PreflightError, match="1000"):
            run_preflight(_cfg(tmp_path, url))


def test_special_token_and_eos_mismatches(tokenizer):
    ours = chat_template_special_tokens(tokenizer)
    moved = dict(ours, **{"<|im_end|>": 7})
    with pytest.raises(PreflightError, match=r"'<\|im_end\|>': 7 vs 151645") as e:
        check_tokenizer({"model_path": "m", "special_tokens": moved}, tokenizer)
    _one_line(e.value)
    with pytest.raises(PreflightError, match="eos_token_id 3"):
        check_tokenizer({"model_path": "m", "eos_token_id": 3}, tokenizer)
    with pytest.raises(PreflightError, match="vocabulary of 1000 ids"):
        check_tokenizer({"model_path": "m", "vocab_size": 1000}, tokenizer)
    check_tokenizer({"model_path": "m", "vocab_size": 151936}, tokenizer)  # padded embedding: fine


def test_what_a_real_sglang_does_not_report_is_logged_not_failed(tokenizer, caplog):
    sglang_info = {"model_path": "Qwen/Qwen3-8B", "tokenizer_path": "Qwen/Qwen3-8B", "is_generation": True,
                   "preferred_sampling_params": None, "weight_version": "default",
                   "has_image_understanding": False, "has_audio_understanding": False,
                   "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}
    with caplog.at_level(logging.INFO, logger="rollout.app.preflight"):
        check_tokenizer(sglang_info, tokenizer)
    [rec] = [r for r in caplog.records if "not checked" in r.getMessage()]
    assert rec.levelno == logging.INFO
    assert "vocabulary size" in rec.getMessage() and "special tokens" in rec.getMessage()


def test_a_tokenizer_that_does_not_load_fails_with_one_line():
    with pytest.raises(PreflightError, match="does not load") as e:
        check_tokenizer({"model_path": "m"}, "/nonexistent/tokenizer/folder")
    _one_line(e.value)


# --------------------------------------------------------------------------- output dir, user check
def test_output_dir_is_created_and_probed(tmp_path):
    target = tmp_path / "a" / "b"
    check_output_dir(target)
    assert target.is_dir() and not list(target.iterdir())


def test_unwritable_output_dir_fails(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(PreflightError, match="rollout.output_dir") as e:
        check_output_dir(blocker / "out")  # a file where a folder should be
    _one_line(e.value)
    with pytest.raises(PreflightError):
        cfg = _cfg(tmp_path, None)
        cfg.rollout.output_dir = str(blocker / "out")
        run_preflight(cfg)
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        try:
            with pytest.raises(PreflightError, match="not writable"):
                check_output_dir(ro)
        finally:
            ro.chmod(0o700)


def test_user_check_failure_is_one_line(tmp_path):
    def broken(user_cfg):
        raise ConnectionError("http://127.0.0.1:9/v1: connection refused\nretry later")

    with pytest.raises(PreflightError, match="user simulator.*ConnectionError") as e:
        run_preflight(_cfg(tmp_path, None), check_user=broken)
    _one_line(e.value)

    async def slow(user_cfg):
        await asyncio.sleep(30)

    # a check waited out would pass (it returns after 30 s): the error is the 0.5 s bound's
    with pytest.raises(PreflightError, match="user simulator.*TimeoutError"):
        run_preflight(_cfg(tmp_path, None), check_user=slow, user_timeout_s=0.5)


async def test_run_preflight_inside_a_running_event_loop(tmp_path):
    async def check_user(user_cfg):
        return user_cfg.kind

    out = run_preflight(_cfg(tmp_path, None), check_user=check_user)
    assert out["user"] == "scripted" and out["model_info"] is None
