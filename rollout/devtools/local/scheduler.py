"""The local server's scheduler: backend steps one at a time, in turn, and weight loads between them.

As SGLang's single scheduler runs one batch at a time, :class:`StepScheduler` runs one backend
step (one ``next()`` of a backend generator = one sampled token, the first one including the
prefill; or ``tokens_per_step`` of them) at a time under a fair step lock (:class:`FairLock`),
checks the stop conditions token by token, and loads new weights only between two steps. The
pause and abort state it obeys is :class:`rollout.devtools.local.control.GenerationControl`'s.
Semantics in :mod:`rollout.devtools.local.server`'s docstring.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from rollout.devtools.local.backend_api import GenerationBackend, SamplingParams
from rollout.devtools.local.control import GenerationControl, InFlight

logger = logging.getLogger(__name__)

DEFAULT_WEIGHT_VERSION = "default"  # SGLang's --weight-version default


class FairLock:
    """A mutex granted in arrival order (FIFO), used as the server's one-step-at-a-time lock.

    ``threading.Lock`` is not fair: a worker thread that releases it and asks again at once
    usually wins, so one request could run all its steps while another waits, which is not how a
    batching server behaves (every running request advances each step). Here ``release`` hands
    the lock straight to the longest waiter, so requests take steps in turn.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._queue: deque[threading.Lock] = deque()
        self._held = False

    def acquire(self) -> None:
        """Block until the lock is ours (after every thread that asked before us)."""
        with self._mutex:
            if not self._held:
                self._held = True
                return
            turn = threading.Lock()
            turn.acquire()
            self._queue.append(turn)
        turn.acquire()  # released by the holder's release(): the lock is ours

    def release(self) -> None:
        """Hand the lock to the longest waiter, or free it when none waits."""
        with self._mutex:
            if self._queue:
                self._queue.popleft().release()  # handed over; stays held
            else:
                self._held = False

    def __enter__(self) -> FairLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class StepScheduler:
    """Runs a backend's steps for every request, one at a time, and swaps its weights between steps.

    Args:
        backend: the :class:`GenerationBackend` that samples tokens.
        tokenizer: ``transformers`` tokenizer (EOS ids, decoding for stop strings).
        control: the server's pause / abort state, checked before every step.
        max_workers: generation threads (:attr:`executor`; concurrent requests beyond it queue).
        weight_version: the initial weight version.

    Attributes:
        executor: the generation threads (/generate steps, text tokenization, chat answers).
        control_executor: two threads for pause waits, weight loads and health steps, never
            queued behind generation threads.
        weight_version: the current weight version (written under the step lock).
        weights_path: the last folder loaded by :meth:`load_weights` (None: the initial weights).
        num_backend_steps: tokens sampled for /generate since start (a counter).
    """

    def __init__(self, backend: GenerationBackend, tokenizer, control: GenerationControl, *,
                 max_workers: int, weight_version: str) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.control = control
        eos = tokenizer.eos_token_id
        self.eos_ids: frozenset[int] = frozenset([eos] if isinstance(eos, int) else (eos or []))
        self.executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="local-gen")
        # Pause waits and weight loads: never queued behind generation threads.
        self.control_executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="local-ctl")
        self.weight_version = str(weight_version)  # written under _step_lock
        self.weights_path: str | None = None  # last model_path loaded by /update_weights_from_disk
        # One backend step (one next() of a generator, or a weight load) at a time, in turn.
        self._step_lock = FairLock()
        self.num_backend_steps = 0  # tokens sampled for /generate since start (under _step_lock)

    def run(self, state: InFlight, input_ids: list[int], params: SamplingParams) -> dict | None:
        """Generate in a worker thread; returns the finish reason, or None when aborted.

        Each backend step runs under the server's step lock and only after checking, with the
        lock held, that the request is neither aborted nor paused: once a pause (or abort) has
        taken the lock, no step of any request starts until generation continues.

        Raises:
            Exception: whatever the backend raises (an infrastructure error).
        """
        if params.max_new_tokens == 0:
            return {"type": "length", "length": 0}
        stops = params.stop
        window = 4 * max((len(s) for s in stops), default=0) + 8
        stop_ids = set(params.stop_token_ids)
        eos_ids = set() if params.ignore_eos else self.eos_ids
        per_step = max(1, int(getattr(self.backend, "tokens_per_step", 1)))
        control = self.control
        gen = None
        try:
            while True:
                if not control.wait_while_paused(state):
                    return None
                with self._step_lock:
                    if state.aborted:
                        return None
                    if control.pause_mode is not None:
                        continue  # paused since the check above: wait again, without stepping
                    if gen is None:
                        gen = self.backend.generate(list(input_ids), params)
                    items = list(itertools.islice(gen, per_step))
                    self.num_backend_steps += len(items)
                    version = self.weight_version
                for item in items:  # each token is checked as if it had come alone
                    tok, lp = int(item[0]), float(item[1])
                    with state.lock:
                        if state.aborted:
                            return None
                        state.ids.append(tok)
                        state.logprobs.append(lp)
                        state.weight_version = version
                        n = len(state.ids)
                        tail = state.ids[-window:] if stops else None
                    if n >= params.max_new_tokens:
                        return {"type": "length", "length": params.max_new_tokens}
                    if tok in stop_ids or tok in eos_ids:
                        return {"type": "stop", "matched": tok}
                    if stops:
                        text = self.tokenizer.decode(tail, skip_special_tokens=False)
                        for s in stops:
                            if s in text:
                                return {"type": "stop", "matched": s}
                if len(items) < per_step:  # the backend ended by itself
                    with state.lock:
                        return None if state.aborted else {"type": "stop", "matched": None}
        finally:
            if gen is not None:
                gen.close()

    def load_weights(self, model_path: str, weight_version: str | None) -> tuple[bool, str]:
        """Load weights in a control thread, between two backend steps; ``(success, message)``.

        On failure (any exception from the backend, or a backend without ``load_weights``) the
        weights and the weight version are unchanged and the message says why.
        """
        with self._step_lock:
            old = self.weight_version
            try:
                load = getattr(self.backend, "load_weights", None)
                if load is None:
                    raise NotImplementedError(f"backend {self.backend.name} cannot load weights")
                load(model_path)
            except Exception as e:  # noqa: BLE001  (any failure is reported, weights unchanged)
                logger.warning("update_weights_from_disk %r failed: %s: %s", model_path, type(e).__name__, e)
                return False, (f"Failed to update weights from {model_path!r}: {type(e).__name__}: {e}. "
                               f"The weights and weight_version {old!r} are unchanged.")
            if weight_version is not None:
                self.weight_version = weight_version
            self.weights_path = model_path
            new = self.weight_version
        logger.info("updated weights from %s (weight_version %r -> %r)", model_path, old, new)
        return True, f"Updated weights from {model_path!r}; weight_version is {new!r}."

    def wait_step_boundary(self) -> None:
        """Block (control thread) until the backend step running now, if any, has ended."""
        with self._step_lock:
            pass

    def step_once(self) -> None:
        """Sample one greedy token for prompt ``[0]`` under the step lock (a health check; not
        counted in :attr:`num_backend_steps`).

        Raises:
            Exception: whatever the backend raises.
        """
        with self._step_lock:
            gen = self.backend.generate([0], SamplingParams(max_new_tokens=1, temperature=0.0))
            try:
                next(gen, None)
            finally:
                gen.close()

    def shutdown(self) -> None:
        """Stop both thread pools without waiting (queued work is cancelled)."""
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.control_executor.shutdown(wait=False, cancel_futures=True)
