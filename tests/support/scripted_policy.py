"""A scripted SGLang-protocol policy server for tests: answers /generate from a Python function.

The function gets ``(episode_id, step, input_ids)`` (``step`` is -1 for a request that is not an
episode's turn, e.g. a context strategy's summary) and returns ``(text, finish)`` where finish
is ``"eos"`` (the text is followed by the tokenizer's EOS id, or the ``eot_ids`` given, as a
model ending its turn),
``"stop"`` (ended on a stop string: no EOS) or ``"length"``. Log-probs are made up but distinct
per position so that alignment errors are visible.
"""

from __future__ import annotations

from aiohttp import web

from rollout.core.episode import parse_request_id


class ScriptedPolicyServer:
    def __init__(self, tokenizer, script, eot_ids: list[int] | None = None):
        self.tokenizer = tokenizer
        self.script = script
        self.eos_id = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
        self.eot_ids = list(eot_ids) if eot_ids is not None else [self.eos_id]

    async def _generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        try:
            eid, _, step = parse_request_id(body["rid"])
        except ValueError:  # not an episode's turn
            eid, step = body["rid"], -1
        text, finish = self.script(eid, step, body["input_ids"])
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if finish == "eos":
            ids += self.eot_ids
        budget = body["sampling_params"]["max_new_tokens"]
        if len(ids) > budget:  # as a server would: cut at max_new_tokens
            ids, finish = ids[:budget], "length"
        fr = {"type": "length", "length": len(ids)} if finish == "length" else {"type": "stop", "matched": self.eot_ids[-1] if finish == "eos" else "</tool_call>"}
        lps = [-0.01 * (k + 1) for k in range(len(ids))]
        return web.json_response({
            "text": text, "output_ids": ids,
            "meta_info": {"id": body["rid"], "finish_reason": fr, "prompt_tokens": len(body["input_ids"]),
                          "completion_tokens": len(ids), "cached_tokens": 0,
                          "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps, ids)]},
        })

    async def __aenter__(self):
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/generate", self._generate)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc):
        await self._runner.cleanup()
