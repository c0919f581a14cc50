"""Where sglang-router sends each ``X-SMG-Routing-Key``: the measurement behind the routing facts
in docs/local-stack.md ("Routing") and :mod:`rollout.devtools.local.stack`'s docstring.

``python -m support.routing_spread [--keys 64] [--calls 3] [--together] [--delay-s 0.2] -- ROUTER_ARGS``
(from ``tests/``, or with ``tests`` on ``PYTHONPATH``) starts four :mod:`support.tagged_worker`
processes and the real router with ``ROUTER_ARGS`` (e.g. ``--policy manual --assignment-mode
min_group``), sends ``--calls`` calls per key (each key's calls one after another; the keys one
after another, or all at once with ``--together``; every prompt shares a 199-token prefix, as
episodes share the system prompt), and prints whether every key's calls landed on one worker, how
many keys each worker got first, and the spread of 40 calls without a key. Then it kills worker 0
and reports how many of the next calls (one per key) failed and where worker 0's keys went.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import subprocess
import sys

import aiohttp

from support.tagged_cluster import tagged_cluster

WORKERS = 4


async def _measure(router: str, keys: int, calls: int, together: bool, procs: list[subprocess.Popen], urls: list[str]) -> None:
    prefix = list(range(1, 200))
    async with aiohttp.ClientSession() as s:
        async def gen(key: str | None, ids: list[int]) -> str:
            headers = {"Content-Type": "application/json"}
            if key is not None:
                headers["X-SMG-Routing-Key"] = key
            body = json.dumps({"input_ids": ids, "sampling_params": {"max_new_tokens": 1}})
            async with s.post(router + "/generate", data=body, headers=headers) as r:
                meta = (await r.json())["meta_info"]
                assert meta["routing_key"] == key
                return meta["worker"]

        async def one_key(k: int) -> list[str]:
            return [await gen(f"key-{k}", prefix + [1000 + k] * (c + 1)) for c in range(calls)]

        if together:
            landed = await asyncio.gather(*[one_key(k) for k in range(keys)])
        else:
            landed = [await one_key(k) for k in range(keys)]
        sticky = all(len(set(w)) == 1 for w in landed)
        first = collections.Counter(w[0] for w in landed)
        print(f"keys {keys}, calls {calls} each, {'all at once' if together else 'one after another'}: "
              f"every key on one worker: {sticky}; keys per worker (first call): "
              + " ".join(f"w{i}={first.get(f'w{i}', 0)}" for i in range(WORKERS))
              + f"; max/mean {max(first.values()) / (keys / WORKERS):.2f}")
        no_key = collections.Counter([await gen(None, prefix + [5000 + i]) for i in range(40)])
        print("40 calls without a key: " + " ".join(f"w{i}={no_key.get(f'w{i}', 0)}" for i in range(WORKERS)))
        os.killpg(procs[0].pid, signal.SIGKILL)
        failed, moved = 0, collections.Counter()
        for k in range(keys):
            try:
                now = await gen(f"key-{k}", [1, 2, 3])
            except (aiohttp.ClientError, KeyError, ValueError, AssertionError):
                failed += 1
                continue
            if landed[k][0] == "w0":
                moved[now] += 1
            elif now != landed[k][0]:
                moved["(another key moved)"] += 1
        print(f"after SIGKILL of w0: {failed} of {keys} calls failed; w0's keys went to {dict(moved)}")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m support.routing_spread")
    p.add_argument("--keys", type=int, default=64)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--together", action="store_true")
    p.add_argument("--delay-s", type=float, default=0.2, help="each /generate waits this long (so that calls overlap)")
    p.add_argument("router_args", nargs=argparse.REMAINDER)
    args = p.parse_args()
    router_args = args.router_args[1:] if args.router_args[:1] == ["--"] else args.router_args
    try:
        with tagged_cluster(router_args, workers=WORKERS, delay_s=args.delay_s) as (router, urls, procs):
            print("router", " ".join(router_args))
            asyncio.run(_measure(router, args.keys, args.calls, args.together, procs, urls))
    except AssertionError as e:
        sys.exit(str(e))

if __name__ == "__main__":
    main()
