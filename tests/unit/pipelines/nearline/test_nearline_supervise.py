"""The nearline supervisor without services: restarts after failures, back-off, counters by kind."""

from __future__ import annotations

import random
import threading

import pytest
from kafka.errors import KafkaConnectionError
from redis.exceptions import ConnectionError as RedisConnectionError

from headwater.pipelines.nearline.fence import NearlineFencedError
from headwater.pipelines.nearline.runner import NearlineCommitError, NearlineSetupError
from headwater.pipelines.nearline.supervise import Backoff, error_kind, supervise_worker


class Scripted:
    """A worker that raises the next scripted failure, or runs (counts a batch) when none is left."""

    def __init__(self, failures: list[BaseException], made: list[Scripted]) -> None:
        self.failures = failures
        self.counters: dict[str, float] = {"events": 0, "batches": 0}
        made.append(self)

    def run(self, stop: threading.Event, idle_exit_s: float | None = None) -> None:
        self.counters["batches"] += 1
        if self.failures:
            raise self.failures.pop(0)


def test_a_failing_worker_is_replaced_until_one_runs_and_every_failure_is_counted() -> None:
    failures: list[BaseException] = [
        RedisConnectionError("Connection refused"),
        RedisConnectionError("Connection refused"),
        KafkaConnectionError("no broker"),
        NearlineSetupError("opening partitions t:0 failed"),
        NearlineCommitError("step 1"),
        ValueError("a bug"),
        NearlineFencedError("transaction t was fenced"),
    ]
    made: list[Scripted] = []
    fast = Backoff(initial_s=0.001, max_s=0.004)
    counters = supervise_worker(lambda: Scripted(failures, made), threading.Event(), backoff=fast)
    assert len(made) == 8
    assert counters["restarts"] == 7
    assert {k: v for k, v in counters.items() if k.startswith("errors_")} == {
        "errors_fenced": 1,
        "errors_redis": 2,
        "errors_kafka": 1,
        "errors_setup": 1,
        "errors_commit": 1,
        "errors_other": 1,
    }
    assert counters["batches"] == 8  # one dict across workers: the totals of the process
    assert all(w.counters is counters for w in made)


def test_a_stop_during_the_back_off_ends_the_supervisor() -> None:
    stop = threading.Event()
    made: list[Scripted] = []

    def make() -> Scripted:
        stop.set()  # SIGTERM while the worker fails
        return Scripted([RedisConnectionError("down")] * 5, made)

    counters = supervise_worker(make, stop, backoff=Backoff(initial_s=60.0, max_s=60.0))
    assert (len(made), counters["restarts"]) == (1, 1)


@pytest.mark.parametrize("attempt", range(12))
def test_the_back_off_doubles_up_to_its_cap_with_the_upper_half_jittered(attempt: int) -> None:
    policy = Backoff(initial_s=0.5, factor=2.0, max_s=30.0)
    step = min(30.0, 0.5 * 2**attempt)
    delays = [policy.delay(attempt, random.Random(seed)) for seed in range(50)]
    assert all(step / 2 <= d <= step for d in delays)
    assert max(delays) - min(delays) > step / 10  # jittered, not all equal


def test_error_kinds_look_through_the_cause() -> None:
    outer = RuntimeError("publish failed")
    outer.__cause__ = RedisConnectionError("down")
    assert error_kind(outer) == "redis"
    assert error_kind(KeyError("x")) == "other"
