"""One answer's impressions as one unit: the template encoder writes the codec's bytes, the producer
sends one record per item (what every tier counts) in one call, and the buffer counts events."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.pipelines.events.codec import DecodedEvent, EventCodec
from headwater.pipelines.events.schema import BehaviorEvent
from headwater.serving.feedback import FeedbackProducer, impression_events, impressions
from headwater.serving.impressions import AnswerEncoder, Impressions

CODEC = EventCodec()
T0 = 1_800_000_000_000


class Sink:
    """Records each call: send_many's records per call, so a test sees one call per answer."""

    def __init__(self) -> None:
        self.calls: list[list[tuple[str, bytes | None, bytes, list[tuple[str, bytes]]]]] = []

    def send(self, topic: str, *, value: bytes, key: bytes | None, headers: list[tuple[str, bytes]]) -> Any:
        self.calls.append([(topic, key, value, headers)])
        return _Acked()

    def send_many(
        self,
        topic: str,
        *,
        values: Any,
        key: bytes | None,
        headers: list[tuple[str, bytes]],
        on_sent: Callable[[Any], None],
        on_failed: Callable[[BaseException], None],
    ) -> int:
        self.calls.append([(topic, key, v, headers) for v in values])
        for _ in values:
            on_sent(None)
        return len(values)

    def poll(self) -> None:
        return None

    def flush(self, timeout: float | None = None) -> None:
        return None

    def close(self, timeout: float | None = None) -> None:
        return None


class _Acked:
    def add_callback(self, fn: Callable[[object], None]) -> _Acked:
        fn(None)
        return self

    def add_errback(self, fn: Callable[[BaseException], None]) -> _Acked:
        return self


def wait_for(check: Callable[[], bool], seconds: float = 10.0) -> None:
    end = time.monotonic() + seconds
    while not check():
        if time.monotonic() > end:
            pytest.fail("condition not met in time")
        time.sleep(0.01)


ids = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)
answers = st.builds(
    Impressions,
    request_id=st.text("0123456789abcdef", min_size=32, max_size=32),
    user_id=ids,
    items=st.lists(ids, min_size=1, max_size=30).map(tuple),
    at_ms=st.integers(946_684_800_000, 4_102_444_799_999),
    session_id=st.none() | ids,
    device=st.sampled_from(["ios", "android", "web"]),
    arm=st.none() | ids,
)


@settings(max_examples=150, deadline=None)
@given(answers)
def test_the_template_writes_the_codecs_bytes_for_every_answer(answer: Impressions) -> None:
    encoder = AnswerEncoder(CODEC)
    assert encoder.templated
    events = answer.events()
    assert encoder.encode(events) == [CODEC.encode(e) for e in events]


@settings(max_examples=100, deadline=None)
@given(
    st.none() | ids,
    st.none() | st.floats(allow_nan=False) | st.integers(-(2**53), 2**53),
    st.none() | st.integers(-(2**63), 2**63 - 1),
    st.none() | ids,
    st.sampled_from(["impression", "click", "purchase"]),
)
def test_every_shared_field_type_writes_like_fastavro(
    category: str | None, price: float | None, dwell: int | None, query: str | None, kind: str
) -> None:
    """The fields impressions leave null (category, price, dwell, query) written with values too."""
    events = Impressions("f" * 32, "u1", ("a", "b"), T0).events()
    for e in events:
        e.update({"category": category, "price": price, "dwell_ms": dwell, "query": query})  # type: ignore[typeddict-item]
        e["event_type"] = kind  # type: ignore[typeddict-item]
    assert AnswerEncoder(CODEC).encode(events) == [CODEC.encode(e) for e in events]


def test_a_value_the_template_cannot_write_falls_back_to_the_codec() -> None:
    events: list[BehaviorEvent] = Impressions("a" * 32, "u1", ("x", "y"), T0).events()
    events[1]["position"] = 2**40  # not an Avro int: the codec refuses it with its own error
    from headwater.pipelines.events.codec import EncodeError

    with pytest.raises(EncodeError, match="cannot encode event"):
        AnswerEncoder(CODEC).encode(events)
    events[1]["position"] = 2
    assert AnswerEncoder(CODEC).encode(events) == [CODEC.encode(e) for e in events]


def test_one_answer_is_one_call_of_one_record_per_item_the_same_records_as_before() -> None:
    sink = Sink()
    producer = FeedbackProducer("t1", lambda: sink)
    producer.start()
    answer = impressions("c" * 32, "u7", ["i3", "i1", "i2"], "s1", "ios", at_ms=T0, arm="exp/b")
    assert producer.offer(answer) == 3
    wait_for(lambda: producer.counters.sent == 3)
    producer.stop()
    (call,) = sink.calls
    assert [(t, k) for t, k, _, _ in call] == [("t1", b"u7")] * 3
    # Byte for byte what the per-event path wrote: impression_events + the arm, encoded one by one.
    before = impression_events("c" * 32, "u7", ["i3", "i1", "i2"], "s1", "ios", at_ms=T0)
    for e in before:
        e["arm"] = "exp/b"
    assert [v for _, _, v, _ in call] == [CODEC.encode(e) for e in before]
    decoded = [CODEC.decode(v, h) for _, _, v, h in call]
    assert all(isinstance(d, DecodedEvent) for d in decoded)
    got = [d.event for d in decoded if isinstance(d, DecodedEvent)]
    assert [(e["event_id"], e["item_id"], e["position"], e["arm"]) for e in got] == [
        (f"{'c' * 32}:{p}", i, p, "exp/b") for p, i in enumerate(["i3", "i1", "i2"], start=1)
    ]
    c = producer.counters
    assert (c.sent, c.dropped, c.failed, c.invalid, producer.buffered) == (3, 0, 0, 0, 0)


def test_the_buffer_counts_events_and_takes_an_answer_whole_or_drops_it_whole() -> None:
    def down() -> Sink:
        raise ConnectionError("no broker")

    producer = FeedbackProducer("t", down, max_buffer=5, reconnect_s=0.05)
    producer.start()
    assert producer.offer(impressions("d" * 32, "u", ["a", "b", "c"])) == 3
    assert producer.offer(impressions("e" * 32, "u", ["a", "b", "c"])) == 0  # 3 + 3 > 5: dropped whole
    assert producer.offer(impression_events("f" * 32, "u", ["a", "b", "c"])) == 2  # events: as many as fit
    assert (producer.buffered, producer.counters.dropped) == (5, 4)
    producer.stop(timeout_s=2.0)
    assert (producer.buffered, producer.counters.dropped, producer.counters.sent) == (0, 9, 0)


def test_an_invalid_answer_is_counted_invalid_and_not_sent() -> None:
    sink = Sink()
    producer = FeedbackProducer("t", lambda: sink)
    producer.start()
    assert producer.offer(impressions("a" * 32, "u" * 300, ["x", "y"])) == 2  # over 256 bytes (ids.max_bytes)
    producer.offer(impressions("b" * 32, "u1", ["x"]))
    wait_for(lambda: producer.counters.sent == 1)
    producer.stop()
    assert (producer.counters.invalid, producer.counters.sent, len(sink.calls)) == (2, 1, 1)
