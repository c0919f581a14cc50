"""A new local Ray cluster that does not start: Ray's bare ``Exception`` (its raylet did not
register within a fixed 30 s, ray/_private/node.py) becomes one ``PreflightError`` line, while any
other error of ``ray.init`` is left as it is. Through the CLI, with the local stack stopped again:
tests/e2e/test_bad_sources.py."""

from __future__ import annotations

import pytest

RAY_MESSAGE = ("The current node timed out during startup. This could happen because some of the raylet failed to startup "
               "or the GCS has become overloaded.")


def _raise(error: BaseException):
    def init(*args, **kwargs):
        raise error
    return init


def test_rays_start_timeout_is_one_preflight_line(monkeypatch):
    import rollout.core.pool.actors as actors
    from rollout.core.startup import PreflightError

    monkeypatch.setattr(actors.ray, "init", _raise(Exception(RAY_MESSAGE)))
    with pytest.raises(PreflightError) as e:
        actors._init_ray(None)
    text = str(e.value)
    assert "\n" not in text and text.startswith("Ray's new local cluster did not start")
    assert "ray start --head" in text and "pool.ray_address=auto" in text
    assert actors.RAY_START_TIMED_OUT in RAY_MESSAGE  # the words it is recognised by are Ray's own


def test_other_ray_init_errors_are_left_as_they_are(monkeypatch):
    import rollout.core.pool.actors as actors

    monkeypatch.setattr(actors.ray, "init", _raise(ValueError("something else")))
    with pytest.raises(ValueError, match="something else"):
        actors._init_ray(None)
