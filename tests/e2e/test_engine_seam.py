"""``open_pool`` reaches the job's engine only through the engine registry (``rollout.core.engines``,
issue 29 item 4): the engine kind registered under the local stack's name is checked before
anything starts, made with its own config section and the job's facts, started in a thread while
Ray and the actors start, its router handed to the pool, and stopped on exit; the start-up's
timeline comes back through ``open_pool``'s ``timeline`` argument (no module global). The engine
here is the real local stack, recording what the wiring asks of it. ``python -m rollout.bench
startup`` (both start-up orders, through the CLI) is in ``tests/e2e/test_startup_bench.py``."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from rollout.core.config import load_config
from rollout.core.engines import ENGINES, LOCAL_STACK, register_engine
from rollout.devtools.local.stack import LocalStackEngine

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.ray]


class RecordingEngine(LocalStackEngine):
    """The local stack, recording each call the wiring makes and the thread it makes it from."""

    calls: list[tuple] = []

    def __init__(self, section, job):
        RecordingEngine.calls.append(("made", section, job))
        super().__init__(section, job)

    @classmethod
    def check_config(cls, cfg):
        cls.calls.append(("check_config",))
        LocalStackEngine.check_config(cfg)

    @classmethod
    def check_modules(cls, cfg):
        cls.calls.append(("check_modules",))
        LocalStackEngine.check_modules(cfg)

    def start(self):
        RecordingEngine.calls.append(("start", threading.current_thread().name))
        return super().start()

    def stop(self):
        RecordingEngine.calls.append(("stop", self.stack.pids()))
        super().stop()


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def recording_engine():
    saved = ENGINES.paths()[LOCAL_STACK]
    RecordingEngine.calls = []
    register_engine(LOCAL_STACK, RecordingEngine, replace=True)
    yield RecordingEngine
    register_engine(LOCAL_STACK, saved, replace=True)


def test_open_pool_starts_the_registered_engine_beside_ray_and_stops_it(tmp_path, recording_engine, monkeypatch, shared_ray):
    from rollout.app.wiring import StartupTimeline, open_pool

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cfg = load_config(str(ROOT / "configs" / "local.yaml"), ["env.task_ids=[0]", "rollout.n_samples_per_task=1", "pool.num_actors=1",
                                                            f"rollout.output_dir={tmp_path / 'out'}", shared_ray.override()])
    timeline = StartupTimeline()
    with open_pool(cfg, timeline=timeline) as (rcfg, pool, task_ids):
        made = next(c for c in recording_engine.calls if c[0] == "made")
        section, job = made[1], made[2]
        assert section == cfg.local and (job.domain, job.tokenizer, job.chat_format) == ("retail", cfg.policy.tokenizer, cfg.policy.chat_format)
        assert job.log_dir == tmp_path / "out" / "local_stack_logs"
        engine_url = rcfg.policy.router_url
        assert engine_url and engine_url.startswith(f"http://{cfg.local.host}:")
        pool.submit_tasks(task_ids)
        results = list(pool.results(timeout_s=300))
    assert [r.status for r in results] == ["completed"] and results[0].reward == 1.0  # gold replay through the engine's router
    names = [c[0] for c in recording_engine.calls]
    assert names == ["check_config", "check_modules", "made", "start", "stop"], names
    started_in = recording_engine.calls[3][1]
    assert started_in.startswith("engine-start"), started_in  # overlapped with Ray, in the wiring's thread
    pids = recording_engine.calls[4][1]  # the servers and the router, as the wiring stopped them
    assert pids and not [p for p in pids if _alive(p)]
    assert timeline.mode == "overlapped" and timeline.actors_ready_s is not None
    assert {"checks", "local_stack", "ray_and_actor_launch", "preflight", "actors_ready"} <= set(timeline.phases)
    launch, stack = timeline.phases["ray_and_actor_launch"], timeline.phases["local_stack"]
    assert stack[0] < launch[1] and launch[0] < stack[1]  # the engine started while Ray and the actors did
