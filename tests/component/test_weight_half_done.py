"""A weight update that one worker fails while the other takes it (a half-done cycle), settled by
:func:`rollout.core.pool.weight_repair.settle_update` against two real local servers, each behind a
:class:`~rollout.devtools.chaos.proxies.WorkerProxy` that fails the updates it is armed to fail
(as SGLang answers a failed load: HTTP 400, ``success: false``, weights unchanged). The pool's
cycle around it (paused throughout, ``last_weight_update``, the counts) is tests/ray/test_half_done_and_straggler.py."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import aiohttp
import pytest

from rollout.core.policy import RouterAdmin, WeightSyncError
from rollout.core.pool.weight_repair import HalfDoneUpdateError, settle_update
from rollout.devtools.chaos.proxies import WorkerProxy

pytestmark = pytest.mark.slow


@pytest.fixture
def proxies(two_servers):
    ps = [WorkerProxy(u).start() for u in two_servers.worker_urls]
    yield ps
    for p in ps:
        p.stop()
    for u in two_servers.worker_urls:  # back to version 0 for the next test
        req = urllib.request.Request(u + "/update_weights_from_disk", json.dumps({"model_path": "reset", "weight_version": "0"}).encode(),
                                     {"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10).read()


def _version(url: str) -> str:
    with urllib.request.urlopen(url + "/model_info", timeout=10) as r:
        return json.loads(r.read())["weight_version"]


def _settle(proxies, version: int, retries: int = 2):
    reports = []

    async def go():
        async with aiohttp.ClientSession() as s:
            admin = RouterAdmin("http://127.0.0.1:1", s, timeout_s=30)  # every call names its workers: the router is not asked
            return await settle_update(admin, [p.url for p in proxies], f"/ckpt/v{version}", version, {}, version - 1, retries, reports.append)

    return asyncio.run(go()), reports


def test_a_worker_that_fails_the_update_once_is_sent_it_again_rolled_forward(two_servers, proxies):
    a, b = proxies
    b.fail_updates(1)
    report, reported = _settle(proxies, 1)
    assert report.outcome == "rolled_forward" and reported == [report]
    assert list(report.failed) == [b.url] and "injected" in report.failed[b.url] and report.retried == [b.url] and report.rolled_back == []
    assert report.serving == {a.url: "1", b.url: "1"} and report.paths == {a.url: "/ckpt/v1", b.url: "/ckpt/v1"}
    assert [_version(u) for u in two_servers.worker_urls] == ["1", "1"]
    assert b.counts["update_failed"] == 1 and b.counts["update_forwarded"] == 1 and a.counts["update_forwarded"] == 1
    assert "rolled_forward" in str(report) and b.url in str(report)


def test_a_worker_that_keeps_failing_it_makes_the_others_roll_back_to_the_weights_they_served(two_servers, proxies):
    a, b = proxies
    b.fail_updates(10)  # the first attempt and both re-sends
    with pytest.raises(HalfDoneUpdateError) as e:
        _settle(proxies, 1, retries=2)
    report = e.value.report
    assert isinstance(e.value, WeightSyncError) and list(e.value.failures) == [b.url]
    assert report.outcome == "rolled_back" and report.retried == [b.url] and report.rolled_back == [a.url]
    assert b.counts["update_failed"] == 3 and a.counts["update_forwarded"] == 2  # the update, then the previous weights again
    assert report.serving == {a.url: "0", b.url: "0"} and [_version(u) for u in two_servers.worker_urls] == ["0", "0"]
    model_path = json.loads(urllib.request.urlopen(two_servers.worker_urls[0] + "/model_info", timeout=10).read())["model_path"]
    assert report.paths[a.url] == model_path  # the weights it was started with, read before the update
    assert f"rolled back to version 0 on {a.url}" in str(report)


def test_an_update_no_worker_takes_is_an_ordinary_failure_nothing_to_settle(two_servers, proxies):
    for p in proxies:
        p.fail_updates(1)
    with pytest.raises(WeightSyncError) as e:
        _settle(proxies, 1)
    assert not isinstance(e.value, HalfDoneUpdateError) and sorted(e.value.failures) == sorted(p.url for p in proxies)
    assert [_version(u) for u in two_servers.worker_urls] == ["0", "0"] and all(p.counts["update_forwarded"] == 0 for p in proxies)
