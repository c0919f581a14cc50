"""The conversation through the trainer API and the journal, on the Ray pool (the episode-level record is tested in tests/component/test_conversation.py)."""

from __future__ import annotations

import json

import pytest
from support.conversation import check_conversation

from rollout.core.config import load_config
from rollout.core.journal import RunJournal
from rollout.core.pool import RolloutPool, make_specs


@pytest.mark.ray
@pytest.mark.slow
def test_the_trainer_api_and_the_journal_carry_the_conversation(ray_cluster, retail_stack, tokenizer, tmp_path):
    for keep in (True, False):
        cfg = load_config(None, [f"policy.router_url={retail_stack.router_url}", "pool.num_actors=1", "pool.num_cpus_per_actor=0.5",
                                 f"rollout.keep_messages={str(keep).lower()}", f"rollout.output_dir={tmp_path / str(keep)}"])
        journal = RunJournal.open(cfg.rollout.output_dir, cfg)
        with RolloutPool(cfg) as pool:
            pool.attach_journal(journal)
            pool.submit(make_specs("retail", ["0", "1"], 1, prefix=f"{keep}:"))
            samples = list(pool.samples())
        journal.close("finished")
        lines = [json.loads(line) for line in (tmp_path / str(keep) / "episodes.jsonl").read_text().splitlines()]
        assert len(samples) == len(lines) == 2
        if keep:
            for s in samples:
                check_conversation(s.messages, tokenizer, s)
            assert sorted(json.dumps(x["messages"]) for x in lines) == sorted(json.dumps(s.messages) for s in samples)
        else:
            assert all(s.messages is None for s in samples) and all(x["messages"] is None for x in lines)
