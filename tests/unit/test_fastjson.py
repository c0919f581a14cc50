"""rollout.core.fastjson: orjson with the standard library's meaning wherever json accepts the input."""

import json
import math

import pytest

from rollout.core import fastjson


def test_round_trip_of_a_generate_body():
    body = {"input_ids": list(range(151_000, 151_643)) * 10, "rid": "ep-1@0#3", "return_logprob": True,
            "sampling_params": {"temperature": 1.0, "top_p": 0.95, "stop": ["</tool_call>"], "max_new_tokens": 512}}
    raw = fastjson.dumps(body)
    assert isinstance(raw, bytes)
    assert json.loads(raw) == body and fastjson.loads(raw) == body


def test_values_orjson_refuses_fall_back_to_the_standard_library():
    big = {"n": 2**70, 3: "non-string key"}
    assert json.loads(fastjson.dumps(big)) == {"n": 2**70, "3": "non-string key"}
    # json writes NaN / Infinity; orjson rejects them on reading, the fallback accepts them
    parsed = fastjson.loads(json.dumps({"lp": float("-inf"), "x": float("nan")}))
    assert parsed["lp"] == float("-inf") and math.isnan(parsed["x"])


def test_not_json_raises_value_error():
    for raw in (b"", b"{", b"\xff\xfe", "not json"):
        with pytest.raises(ValueError):
            fastjson.loads(raw)
    with pytest.raises(TypeError):
        fastjson.dumps({"x": object()})


def test_numpy_ids_are_written_as_a_list_on_both_paths():
    import numpy as np

    ids = np.array([0, 151_643, 2**40], dtype=np.int64)
    assert json.loads(fastjson.dumps({"input_ids": ids})) == {"input_ids": [0, 151_643, 2**40]}
    # a body orjson refuses (a 70-bit int) takes the standard library with the array in it
    assert json.loads(fastjson.dumps({"input_ids": ids, "n": 2**70, "s": np.int64(3)})) == {"input_ids": [0, 151_643, 2**40], "n": 2**70, "s": 3}
    with pytest.raises(TypeError):
        fastjson.dumps({"x": object()})


def test_a_line_reads_back_as_the_standard_librarys_line_would_non_finite_floats_included():
    import numpy as np

    plain = {"tokens": [1, 2, 3], "rollout_log_probs": [-0.5, 0.0, -1e-05], "reward": 1.0, "error": None,
             "messages": [{"role": "user", "content": "Zoë's order #W123 — ünïcode"}], "metadata": {"t": [0.25, 2**70]}}
    for obj in (plain, {**plain, "rollout_log_probs": [-0.5, float("-inf")]}, {**plain, "reward": float("nan")},
                {**plain, "x": np.array([1.0, np.nan])}, {"n": None, "y": (1.5, float("inf"))}):
        line = fastjson.dumps_line(obj)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        ours, theirs = json.loads(line), json.loads(json.dumps(obj, default=lambda v: v.tolist()))
        assert json.dumps(ours, sort_keys=True) == json.dumps(theirs, sort_keys=True)  # NaN compares by its text
    small = {**plain, "metadata": {"t": [0.25, 7]}}
    assert fastjson.dumps_line(small) == fastjson.orjson.dumps(small) + b"\n"  # the fast path
    assert b"NaN" in fastjson.dumps_line({"reward": float("nan"), "e": None})  # not orjson's null
