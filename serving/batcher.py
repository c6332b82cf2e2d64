"""Micro-batching: merge concurrent scoring requests into one model forward, by priority class.

One queue per priority class (``high`` before ``normal`` before ``low``), each bounded in
requests; a full queue raises :class:`QueueFullError` (the service answers 429). A dispatcher
task forms batches:

1. Wait for the first request of any class.
2. Gather more, highest class first, until ``max_delay_s`` after the first one was enqueued
   or until the next request would push the batch past ``max_batch_rows`` (a request is never
   split; one larger than the bound runs alone).
3. Drop requests whose deadline has passed (their futures get :class:`DeadlineExceededError`).
4. Run the batch in the single model thread; hand each request its slice of the result, or
   the model's exception.

While one batch runs, new requests queue up and form the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from headwater.registry.errors import HeadwaterError

P = TypeVar("P")
R = TypeVar("R")
PRIORITIES = ("high", "normal", "low")


class QueueFullError(HeadwaterError, RuntimeError):
    """The queue of a priority class is full; retry after ``retry_after_s`` seconds."""

    def __init__(self, priority: str, limit: int, retry_after_s: int) -> None:
        msg = (
            f"the {priority!r} queue holds its limit of {limit} waiting requests;"
            f" retry after {retry_after_s} s"
        )
        super().__init__(msg)
        self.priority = priority
        self.retry_after_s = retry_after_s


class DeadlineExceededError(HeadwaterError, TimeoutError):
    """The request's deadline passed before the model could score it."""


@dataclass
class _Job(Generic[P, R]):
    payload: P
    rows: int
    deadline: float
    enqueued: float
    future: asyncio.Future[R] = field(repr=False)


@dataclass(frozen=True)
class BatchStats:
    """Reported to ``on_batch`` after each forward."""

    requests: int
    rows: int
    seconds: float
    queue_wait_s: float


class MicroBatcher(Generic[P, R]):
    """Batches payloads for ``score_batch`` (called in one worker thread with a list of payloads)."""

    def __init__(
        self,
        score_batch: Callable[[Sequence[P]], Sequence[R]],
        *,
        max_delay_s: float = 0.001,
        max_batch_rows: int = 8192,
        max_queue_requests: int = 128,
        retry_after_s: int = 1,
        on_batch: Callable[[BatchStats], None] | None = None,
    ) -> None:
        self._score = score_batch
        self.max_delay_s = max_delay_s
        self.max_batch_rows = max_batch_rows
        self.max_queue_requests = max_queue_requests
        self.retry_after_s = retry_after_s
        self._on_batch = on_batch
        self._queues: dict[str, deque[_Job[P, R]]] = {p: deque() for p in PRIORITIES}
        self._wakeup = asyncio.Event()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="headwater-model")
        self._task: asyncio.Task[None] | None = None

    def depth(self, priority: str) -> int:
        """Return how many requests wait in one priority class."""
        return len(self._queues[priority])

    def is_full(self, priority: str) -> bool:
        """Whether one more request of ``priority`` would be refused."""
        return len(self._queues[priority]) >= self.max_queue_requests

    def start(self) -> None:
        """Start the dispatcher task on the running loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._dispatch(), name="headwater-batcher")

    async def stop(self) -> None:
        """Stop the dispatcher; waiting requests fail with :class:`DeadlineExceededError`."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for queue in self._queues.values():
            while queue:
                self._fail(queue.popleft(), DeadlineExceededError("the service is shutting down"))
        self._worker.shutdown(wait=False, cancel_futures=True)

    def submit(self, payload: P, rows: int, priority: str, deadline: float) -> asyncio.Future[R]:
        """Queue ``payload`` (``rows`` candidate rows) until ``deadline`` (loop time, seconds)."""
        queue = self._queues[priority]
        if len(queue) >= self.max_queue_requests:
            raise QueueFullError(priority, self.max_queue_requests, self.retry_after_s)
        loop = asyncio.get_running_loop()
        job: _Job[P, R] = _Job(payload, rows, deadline, loop.time(), loop.create_future())
        queue.append(job)
        self._wakeup.set()
        return job.future

    def _next(self, room: int | None) -> _Job[P, R] | None:
        for priority in PRIORITIES:
            queue = self._queues[priority]
            if queue and (room is None or queue[0].rows <= room):
                return queue.popleft()
            if queue:
                return None  # a higher class waits for the next batch rather than be overtaken
        return None

    async def _gather(self) -> list[_Job[P, R]]:
        loop = asyncio.get_running_loop()
        # Step 1
        while (first := self._next(None)) is None:
            self._wakeup.clear()
            await self._wakeup.wait()
        batch, rows = [first], first.rows
        until = first.enqueued + self.max_delay_s
        # Step 2
        while rows < self.max_batch_rows:
            job = self._next(self.max_batch_rows - rows)
            if job is not None:
                batch.append(job)
                rows += job.rows
                continue
            left = until - loop.time()
            if left <= 0 or any(self._queues.values()):
                break
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), left)
            except TimeoutError:
                break
        return batch

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._gather()
            # Step 3
            now = loop.time()
            live = []
            for job in batch:
                if job.future.done():
                    continue
                if job.deadline <= now:
                    self._fail(job, DeadlineExceededError("the deadline passed while the request was queued"))
                else:
                    live.append(job)
            if not live:
                continue
            # Step 4
            await self._run(live, now)

    async def _run(self, jobs: list[_Job[P, R]], now: float) -> None:
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            results = await loop.run_in_executor(self._worker, self._score, [job.payload for job in jobs])
            if len(results) != len(jobs):
                msg = f"score_batch returned {len(results)} results for {len(jobs)} requests"
                raise RuntimeError(msg)
        except Exception as exc:
            for job in jobs:
                self._fail(job, exc)
            return
        elapsed = time.perf_counter() - started
        for job, result in zip(jobs, results, strict=True):
            if not job.future.done():
                job.future.set_result(result)
        if self._on_batch is not None:
            wait = sum(now - job.enqueued for job in jobs) / len(jobs)
            self._on_batch(BatchStats(len(jobs), sum(job.rows for job in jobs), elapsed, wait))

    @staticmethod
    def _fail(job: _Job[P, R], exc: BaseException) -> None:
        if not job.future.done():
            job.future.set_exception(exc)
