"""What a signal handler raises while the driver waits in Ray reaches the caller as itself, on every
path: a bare wait (:mod:`rollout.core.pool.raycalls`), the trainer API's ``results`` (the
scheduler's wait loop used to take it for a Ray failure and go on: a CI run's ``collect_groups``
went 601 s past its test's 300 s timeout), and the CLI's start-up (SIGINT while the actors start:
``Interrupted``, which the CLI turns into an ``interrupted`` summary, instead of a ``SystemError``)."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import traceback

import pytest
from support.raypool import pool_config

pytestmark = [pytest.mark.ray, pytest.mark.slow]


class _Alarm(BaseException):
    """What the test's SIGUSR1 handler raises (a BaseException, as KeyboardInterrupt is)."""


@contextlib.contextmanager
def _alarm_in(seconds: float):
    """Raise :class:`_Alarm` in the main thread ``seconds`` from now (SIGUSR1 sent to it by a
    timer thread; SIGALRM is pytest-timeout's); the previous handler comes back on exit."""

    def handler(signum, frame):
        raise _Alarm(f"signal after {seconds} s")

    old = signal.signal(signal.SIGUSR1, handler)
    timer = threading.Timer(seconds, signal.pthread_kill, (threading.main_thread().ident, signal.SIGUSR1))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()
        signal.signal(signal.SIGUSR1, old)


def test_a_handlers_exception_in_a_ray_wait_comes_out_as_itself(ray_cluster):
    """Ray's own behaviour, which rollout.core.pool.raycalls exists for: a handler's exception
    during ray.get is only seen when the call returns, as a SystemError caused by it;
    raycalls.get and raycalls.wait raise the handler's exception itself within a slice
    (SLICE_S), however long the wait, and keep ray.get's timeout."""
    import ray
    from ray.exceptions import GetTimeoutError

    from rollout.core.pool import raycalls

    @ray.remote(num_cpus=0)
    def sleeper(s: float) -> float:
        time.sleep(s)
        return s

    def pending() -> bool:
        return not ray.wait([ref], timeout=0)[0]

    ref = sleeper.remote(240.0)  # still running when every wait below has ended (each waits at most 3 s... 240 s)
    try:
        t0 = time.monotonic()
        with pytest.raises(SystemError) as raw, _alarm_in(0.5):
            ray.get(ref, timeout=3.0)
        assert time.monotonic() - t0 >= 2.5  # not before the call returned
        assert isinstance(raw.value.__cause__, _Alarm)
        assert raycalls.raised_by_signal_handler(raw.value) is raw.value.__cause__
        for call in (lambda: raycalls.get(ref), lambda: raycalls.get([ref], timeout=1000), lambda: raycalls.wait([ref], timeout=1000)):
            with pytest.raises(_Alarm), _alarm_in(0.5):
                call()
            # it came out during the wait (which would end only with the 240 s task or the 1000 s
            # timeout), not at its end: the awaited task is still running
            assert pending()
        t0 = time.monotonic()
        with pytest.raises(GetTimeoutError):
            raycalls.get(ref, timeout=1.5)
        assert time.monotonic() - t0 >= 1.4 and pending()  # ray.get's timeout kept, not waited past
        assert raycalls.wait([ref], timeout=0.2) == ([], [ref])
        assert raycalls.get(sleeper.remote(0.0), timeout=60) == 0.0
    finally:
        ray.cancel(ref, force=True)
    assert raycalls.raised_by_signal_handler(SystemError("no cause")) is None


def test_a_handlers_exception_stops_the_trainer_apis_wait_for_results(ray_cluster, retail_stack, retail):
    """pool.results() waiting on episodes held at their first /generate call: the handler's
    exception comes out of it within seconds (it used to be logged as 'ray.wait failed' and the
    wait went on); the pool still shuts down cleanly after."""
    import ray

    from rollout.core.pool import RolloutPool

    pool = RolloutPool(pool_config(retail_stack.router_url)).start()
    try:
        ray.get(pool.actors[0].pause_generation.remote(), timeout=30)  # the episodes wait at their first call
        pool.submit_tasks(retail.task_ids("base")[:2])
        # the episodes are held for good: a wait that went on after the handler's exception
        # would end only in the results' TimeoutError (120 s), not in _Alarm
        with pytest.raises(_Alarm), _alarm_in(2.0):
            list(pool.results(timeout_s=120))
    finally:
        pool.shutdown()


def test_sigint_while_the_actors_start_is_interrupted_not_a_system_error(ray_cluster, retail_stack):
    """The CLI's SignalStop raises Interrupted for a SIGINT before the pool runs; one that comes
    while RolloutPool.start() waits for the actors to be ready reaches the caller as Interrupted
    (the CLI's start-up path: rollout.app.cli)."""
    from rollout.app.signals import Interrupted, SignalStop
    from rollout.core.pool import RolloutPool

    pool = RolloutPool(pool_config(retail_stack.router_url))
    pool.start(wait=False)  # the actors are created; they load the domain and the tokenizer meanwhile
    timer = threading.Timer(0.05, lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGINT))
    try:
        with pytest.raises(Interrupted, match="SIGINT") as e, SignalStop():
            timer.start()
            pool.start()  # waits for the actors (over a second: each loads retail and the tokenizer)
            time.sleep(5)  # only reached when the actors were ready first: the assertion below says so
    finally:
        timer.cancel()
        pool.shutdown()
    frames = [f.name for f in traceback.extract_tb(e.value.__traceback__)]
    assert "wait_ready" in frames, f"the SIGINT did not come while the actors started: {frames}"
