from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import pytest

from headwater.serving.batcher import DeadlineExceededError, MicroBatcher, QueueFullError

T = TypeVar("T")


class FakeScorer:
    """Doubles each payload; records batches; can be held to let the queues fill."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail: Exception | None = None

    def __call__(self, payloads: Sequence[int]) -> list[int]:
        self.gate.wait(5)
        self.batches.append(list(payloads))
        if self.fail is not None:
            raise self.fail
        return [p * 2 for p in payloads]


def _run(coro_fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(coro_fn())


def test_concurrent_requests_merge_into_one_forward() -> None:
    scorer = FakeScorer()

    async def main() -> list[int]:
        b: MicroBatcher[int, int] = MicroBatcher(scorer, max_delay_s=0.05, max_batch_rows=1000)
        b.start()
        loop = asyncio.get_running_loop()
        futs = [b.submit(i, 10, "normal", loop.time() + 5) for i in range(5)]
        out = list(await asyncio.gather(*futs))
        await b.stop()
        return out

    assert _run(main) == [0, 2, 4, 6, 8]
    assert scorer.batches == [[0, 1, 2, 3, 4]]


def test_batch_is_bounded_by_rows() -> None:
    scorer = FakeScorer()

    async def main() -> None:
        b: MicroBatcher[int, int] = MicroBatcher(scorer, max_delay_s=0.05, max_batch_rows=25)
        b.start()
        loop = asyncio.get_running_loop()
        await asyncio.gather(*[b.submit(i, 10, "normal", loop.time() + 5) for i in range(5)])
        await b.stop()

    _run(main)
    assert scorer.batches == [[0, 1], [2, 3], [4]]


def test_higher_priority_is_served_first() -> None:
    scorer = FakeScorer()

    async def main() -> None:
        b: MicroBatcher[int, int] = MicroBatcher(scorer, max_delay_s=0.0, max_batch_rows=10)
        b.start()
        loop = asyncio.get_running_loop()
        scorer.gate.clear()
        first = b.submit(0, 10, "normal", loop.time() + 5)  # occupies the worker
        await asyncio.sleep(0.05)
        low = b.submit(1, 10, "low", loop.time() + 5)
        normal = b.submit(2, 10, "normal", loop.time() + 5)
        high = b.submit(3, 10, "high", loop.time() + 5)
        scorer.gate.set()
        await asyncio.gather(first, low, normal, high)
        await b.stop()

    _run(main)
    assert scorer.batches == [[0], [3], [2], [1]]


def test_full_queue_raises_with_retry_after() -> None:
    scorer = FakeScorer()

    async def main() -> None:
        b: MicroBatcher[int, int] = MicroBatcher(scorer, max_queue_requests=2, retry_after_s=3)
        loop = asyncio.get_running_loop()
        b.submit(1, 1, "low", loop.time() + 5)
        b.submit(2, 1, "low", loop.time() + 5)
        assert b.is_full("low")
        assert not b.is_full("high")
        with pytest.raises(QueueFullError) as info:
            b.submit(3, 1, "low", loop.time() + 5)
        assert info.value.retry_after_s == 3
        assert "'low' queue holds its limit of 2" in str(info.value)
        b.submit(4, 1, "high", loop.time() + 5)  # other classes still accept
        await b.stop()

    _run(main)


def test_expired_request_is_not_scored() -> None:
    scorer = FakeScorer()

    async def main() -> None:
        b: MicroBatcher[int, int] = MicroBatcher(scorer, max_delay_s=0.0)
        loop = asyncio.get_running_loop()
        late = b.submit(1, 1, "normal", loop.time() - 1)
        ok = b.submit(2, 1, "normal", loop.time() + 5)
        b.start()
        assert await ok == 4
        with pytest.raises(DeadlineExceededError):
            await late
        await b.stop()

    _run(main)
    assert scorer.batches == [[2]]


def test_scorer_error_reaches_every_request_of_the_batch() -> None:
    scorer = FakeScorer()
    scorer.fail = RuntimeError("boom")

    async def main() -> list[BaseException | int]:
        b: MicroBatcher[int, int] = MicroBatcher(scorer, max_delay_s=0.05)
        b.start()
        loop = asyncio.get_running_loop()
        out = await asyncio.gather(
            *[b.submit(i, 1, "normal", loop.time() + 5) for i in range(3)], return_exceptions=True
        )
        scorer.fail = None
        assert await b.submit(7, 1, "normal", loop.time() + 5) == 14  # the dispatcher survives
        await b.stop()
        return out

    out = _run(main)
    assert all(isinstance(e, RuntimeError) and str(e) == "boom" for e in out)
