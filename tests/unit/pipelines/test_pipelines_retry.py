"""retry_call: retries the listed errors with back-off, gives up after its patience, others at once."""

from __future__ import annotations

import pytest

from headwater.pipelines.retry import Backoff, retry_call


def test_it_retries_until_the_call_succeeds_and_reports_each_retry() -> None:
    calls, waits, heard = [], [], []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 4:
            raise ConnectionError("down")
        return "ok"

    policy = Backoff(initial_s=1.0, max_s=4.0)
    hear = lambda exc, s: heard.append(type(exc).__name__)  # noqa: E731
    got = retry_call(flaky, (ConnectionError,), "writing", policy, on_retry=hear, sleep=waits.append)
    assert got == "ok"
    assert len(calls) == 4
    assert heard == ["ConnectionError"] * 3
    assert [0.5 <= waits[0] <= 1.0, 1.0 <= waits[1] <= 2.0, 2.0 <= waits[2] <= 4.0] == [True] * 3


def test_other_errors_are_raised_at_once() -> None:
    def bug() -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        retry_call(bug, (ConnectionError,), "writing", sleep=lambda s: None)


def test_it_gives_up_after_its_patience_with_a_note() -> None:
    def down() -> None:
        raise ConnectionError("down")

    with pytest.raises(ConnectionError) as caught:
        retry_call(down, (ConnectionError,), "writing view v", give_up_after_s=0.0, sleep=lambda s: None)
    assert "writing view v: gave up after 1 attempts" in caught.value.__notes__[0]
