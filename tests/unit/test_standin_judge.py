"""The test suite's stand-in NL-assertion judge (tests/support/standin_judge.py, used against the
real tau2-bench >= 1.0 in tests/e2e/test_regrade_tau3.py) answers a tau2-shaped judge request with
every expected outcome met, as bare JSON in an OpenAI chat-completion reply."""

from __future__ import annotations

import json
import urllib.request

from support.standin_judge import StandinJudge, outcomes


def test_it_reads_the_outcomes_back_and_says_each_was_met():
    asked = ["The agent refunds $10", "The agent says 'thanks'"]
    prompt = f"\n        conversation:\n        user: hi\n        \n        expectedOutcomes:\n        {asked}\n        "
    assert outcomes(prompt) == asked and outcomes("no list here") == [] and outcomes("expectedOutcomes: not a list") == []
    with StandinJudge() as judge:
        body = json.dumps({"model": "gpt-4.1", "messages": [{"role": "system", "content": "TASK"}, {"role": "user", "content": prompt}]})
        req = urllib.request.Request(judge.url + "/chat/completions", data=body.encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            reply = json.loads(r.read())
        assert judge.calls == 1
    results = json.loads(reply["choices"][0]["message"]["content"])["results"]
    assert [(x["expectedOutcome"], x["metExpectation"]) for x in results] == [(a, True) for a in asked]
