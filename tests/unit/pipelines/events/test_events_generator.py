import copy
from collections import Counter
from dataclasses import replace

import pytest

from headwater.pipelines.events.codec import DecodedEvent, DecodeError, EventCodec, Reason
from headwater.pipelines.events.generator import (
    MALFORMED_KINDS,
    Emission,
    EventGenerator,
    GeneratorConfig,
)
from headwater.pipelines.events.schema import BehaviorEvent

N = 40_000


@pytest.fixture(scope="module")
def codec() -> EventCodec:
    return EventCodec()


@pytest.fixture(scope="module")
def stream(codec: EventCodec) -> tuple[EventGenerator, list[list[float]], list[Emission]]:
    """A default-config stream with the users' preferences as they were before it started."""
    generator = EventGenerator(GeneratorConfig(seed=11, diurnal_amplitude=0.0), codec)
    initial = copy.deepcopy(generator.users.preferences)
    return generator, initial, generator.take(N)


def events_of(emissions: list[Emission]) -> list[BehaviorEvent]:
    return [e.event for e in emissions if e.event is not None and not e.duplicate]


def test_same_config_same_stream(codec: EventCodec) -> None:
    config = GeneratorConfig(seed=5, malformed_share=0.05, duplicate_share=0.05)
    first = EventGenerator(config, codec).take(5_000)
    second = EventGenerator(config, codec).take(5_000)
    assert first == second
    assert sum(e.malformed is not None for e in first) > 100


def test_other_seed_other_world_and_stream(codec: EventCodec) -> None:
    a = EventGenerator(GeneratorConfig(seed=1), codec)
    b = EventGenerator(GeneratorConfig(seed=2), codec)
    assert a.catalog.category != b.catalog.category
    assert [e.event for e in a.take(100)] != [e.event for e in b.take(100)]


def test_start_time_changes_ids_not_the_world(codec: EventCodec) -> None:
    a = EventGenerator(GeneratorConfig(seed=1, drift_per_session=0.0), codec)
    b = EventGenerator(GeneratorConfig(seed=1, drift_per_session=0.0, start_ms=1_800_000_000_000), codec)
    assert a.catalog == b.catalog
    assert a.users.preferences == b.users.preferences
    assert a.users.device == b.users.device
    ids_a = {e.event["event_id"] for e in a.take(2_000) if e.event}
    ids_b = {e.event["event_id"] for e in b.take(2_000) if e.event}
    assert not ids_a & ids_b


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"late_share": 1.5}, r"GeneratorConfig\.late_share: expected a value in \[0\.0, 1\.0\], found 1\.5"),
        ({"malformed_share": -0.1}, r"malformed_share"),
        ({"late_share": 0.6, "out_of_order_share": 0.6}, r"late_share \+ out_of_order_share"),
        ({"rate": 0.0}, r"GeneratorConfig\.rate"),
        ({"categories": 99}, r"categories: expected a value in \[1, 16\], found 99"),
        ({"late_min_ms": 10_000, "late_max_ms": 5_000}, r"late_max_ms"),
    ],
)
def test_config_rejects_out_of_range_values(change: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GeneratorConfig(**change)  # type: ignore[arg-type]


def test_every_event_is_valid_and_round_trips(codec: EventCodec, stream: tuple) -> None:
    _, _, emissions = stream
    hdrs = codec.headers(produce_ts_ms=1)
    for event in events_of(emissions):
        assert codec.validate(event) is None, event
        result = codec.decode(codec.encode(event), hdrs)
        assert isinstance(result, DecodedEvent)
        assert result.event == {"arm": None, **event}  # generated events are outside experiments


def test_event_time_follows_the_simulated_clock(stream: tuple) -> None:
    generator, _, emissions = stream
    clock = [e.sim_time_ms for e in emissions]
    assert clock == sorted(clock)
    on_time = [e for e in emissions if e.event and not (e.late or e.out_of_order or e.duplicate)]
    assert all(e.event["event_time"] == e.sim_time_ms for e in on_time)
    span_s = (clock[-1] - generator.config.start_ms) / 1000
    assert span_s == pytest.approx(N / generator.config.rate, rel=0.03)


def test_zipf_head_gets_most_impressions(stream: tuple) -> None:
    generator, _, emissions = stream
    rank = dict(zip(generator.catalog.item_ids, generator.catalog.popularity_rank, strict=True))
    items = len(rank)
    shown = [rank[e["item_id"]] for e in events_of(emissions) if e["event_type"] == "impression"]
    top_1pct = sum(r <= items // 100 for r in shown) / len(shown)
    top_10pct = sum(r <= items // 10 for r in shown) / len(shown)
    assert 0.2 < top_1pct < 0.6  # uniform popularity would give 0.01
    assert 0.5 < top_10pct < 0.9  # uniform: 0.10
    assert len(set(shown)) > items // 2  # and a long tail is still shown


def test_event_type_mix(stream: tuple) -> None:
    _, _, emissions = stream
    mix = Counter(e["event_type"] for e in events_of(emissions))
    total = sum(mix.values())
    share = {kind: count / total for kind, count in mix.items()}
    assert 0.75 < share["impression"] < 0.95
    assert 0.02 < share["click"] < 0.10
    assert 0.005 < share["search"] < 0.05
    assert 0.7 * mix["click"] < mix["dwell"] <= mix["click"]  # a click's dwell follows it (some still queued)
    assert mix["like"] > mix["share"] > 0
    assert mix["purchase"] > 0


def test_follow_ups_come_after_a_click_on_the_same_item(stream: tuple) -> None:
    _, _, emissions = stream
    clicked: set[tuple[str, str | None]] = set()
    fresh: dict[str, bool] = {}  # sessions already open at the start may show a dwell before its click
    follow_ups = 0
    for event in events_of(emissions):
        kind = event["event_type"]
        first = kind == "search" or (kind == "impression" and event["position"] == 1)
        if not fresh.setdefault(event["session_id"], first):
            continue
        key = (event["session_id"], event["item_id"])
        if event["event_type"] == "click":
            clicked.add(key)
        elif event["event_type"] in ("dwell", "like", "share", "purchase"):
            assert key in clicked, event
            follow_ups += 1
    assert follow_ups > 1_000


def _impressions_with_clicks(events: list[BehaviorEvent]) -> list[tuple[BehaviorEvent, bool]]:
    clicked = {(e["session_id"], e["item_id"], e["position"]) for e in events if e["event_type"] == "click"}
    return [
        (e, (e["session_id"], e["item_id"], e["position"]) in clicked)
        for e in events
        if e["event_type"] == "impression"
    ]


def test_ctr_falls_with_position(stream: tuple) -> None:
    _, _, emissions = stream
    shown, clicks = Counter[int](), Counter[int]()
    for impression, clicked in _impressions_with_clicks(events_of(emissions)):
        shown[impression["position"] or 0] += 1
        clicks[impression["position"] or 0] += clicked
    ctr = {p: clicks[p] / shown[p] for p in shown}
    assert set(ctr) == set(range(1, 11))
    assert ctr[1] > ctr[2] > ctr[5] > ctr[10]
    assert ctr[1] > 5 * ctr[10]


def test_ctr_is_higher_in_the_users_preferred_category(stream: tuple) -> None:
    generator, initial, emissions = stream
    names = generator.catalog.category_names
    shown, clicks = Counter[bool](), Counter[bool]()
    for impression, clicked in _impressions_with_clicks(events_of(emissions)):
        prefs = initial[int(impression["user_id"][1:])]
        favourite = names[max(range(len(prefs)), key=prefs.__getitem__)]
        preferred = impression["category"] == favourite
        shown[preferred] += 1
        clicks[preferred] += clicked
    assert shown[True] > 5_000
    assert clicks[True] / shown[True] > 1.5 * clicks[False] / shown[False]


def test_searches_carry_a_query_and_their_slate_follows(stream: tuple) -> None:
    generator, _, emissions = stream
    events = events_of(emissions)
    searches = [e for e in events if e["event_type"] == "search"]
    assert searches
    assert all(
        e["query"] and e["item_id"] is None and e["category"] in generator.catalog.category_names
        for e in searches
    )
    for search in searches[:20]:
        start = next(i for i, e in enumerate(events) if e is search)
        slate = events[start + 1 : start + 11]  # a slate is rendered at once, right after the search
        assert [e["event_type"] for e in slate] == ["impression"] * 10
        assert [e["position"] for e in slate] == list(range(1, 11))
        assert {e["category"] for e in slate} == {search["category"]}
        assert {e["session_id"] for e in slate} == {search["session_id"]}


def test_sessions_have_several_events_on_one_device(stream: tuple) -> None:
    _, _, emissions = stream
    by_session: dict[str, list[BehaviorEvent]] = {}
    for event in events_of(emissions):
        by_session.setdefault(event["session_id"], []).append(event)
    sizes = sorted(len(v) for v in by_session.values())
    assert sizes[len(sizes) // 2] >= 10  # a median session shows at least one slate
    assert all(
        len({e["user_id"] for e in v}) == 1 and len({e["device"] for e in v}) == 1
        for v in by_session.values()
    )


def test_preferences_drift_only_when_asked(codec: EventCodec) -> None:
    still = EventGenerator(GeneratorConfig(seed=3, drift_per_session=0.0), codec)
    before = copy.deepcopy(still.users.preferences)
    still.take(5_000)
    assert still.users.preferences == before
    moving = EventGenerator(GeneratorConfig(seed=3, drift_per_session=1.0, drift_step=0.5), codec)
    moving.take(5_000)
    changed = sum(a != b for a, b in zip(before, moving.users.preferences, strict=True))
    assert changed > 100
    assert all(sum(p) == pytest.approx(1.0) for p in moving.users.preferences)


def test_diurnal_curve_shapes_the_rate(codec: EventCodec) -> None:
    config = GeneratorConfig(seed=4, rate=0.5, diurnal_amplitude=0.8, diurnal_peak_hour=20.0)
    generator = EventGenerator(config, codec)
    assert generator.rate_at(config.start_ms + 20 * 3_600_000) == pytest.approx(0.9)
    assert generator.rate_at(config.start_ms + 8 * 3_600_000) == pytest.approx(0.1)
    per_hour = Counter[int]()
    for emission in generator:
        hour = (emission.sim_time_ms - config.start_ms) // 3_600_000
        if hour >= 24:
            break
        per_hour[hour] += 1
    peak = sum(per_hour[h] for h in (18, 19, 20, 21))
    trough = sum(per_hour[h] for h in (6, 7, 8, 9))
    assert peak > 4 * trough
    assert sum(per_hour.values()) == pytest.approx(0.5 * 86_400, rel=0.05)


def test_anomaly_shares_are_honoured(codec: EventCodec) -> None:
    config = GeneratorConfig(
        seed=9, late_share=0.05, out_of_order_share=0.08, duplicate_share=0.04, malformed_share=0.03
    )
    emissions = EventGenerator(config, codec).take(N)
    tolerance = 0.006  # > 4 standard deviations at N = 40,000
    assert sum(e.malformed is not None for e in emissions) / N == pytest.approx(0.03, abs=tolerance)
    assert sum(e.duplicate for e in emissions) / N == pytest.approx(0.04, abs=tolerance)
    fresh = [e for e in emissions if e.event is not None and not e.duplicate]
    assert sum(e.late for e in fresh) / len(fresh) == pytest.approx(0.05, abs=tolerance)
    assert sum(e.out_of_order for e in fresh) / len(fresh) == pytest.approx(0.08, abs=tolerance)


def test_late_out_of_order_and_duplicates_look_like_what_they_are(codec: EventCodec) -> None:
    config = GeneratorConfig(seed=9, late_share=0.05, out_of_order_share=0.05, duplicate_share=0.05)
    emissions = EventGenerator(config, codec).take(10_000)
    seen: dict[str, BehaviorEvent] = {}
    for e in emissions:
        if e.event is None:
            continue
        lag = e.sim_time_ms - e.event["event_time"]
        if e.duplicate:
            assert seen[e.event["event_id"]] == e.event  # same id, same content
        elif e.late:
            assert config.late_min_ms <= lag <= config.late_max_ms
        elif e.out_of_order:
            assert 1 <= lag <= config.out_of_order_max_ms
        else:
            assert lag == 0
        seen[e.event["event_id"]] = e.event


def test_malformed_payloads_are_rejected_with_their_reason(codec: EventCodec) -> None:
    config = GeneratorConfig(seed=13, malformed_share=0.2)
    bad = [e.malformed for e in EventGenerator(config, codec).take(10_000) if e.malformed is not None]
    assert {m.kind for m in bad} == set(MALFORMED_KINDS)
    expected = {
        "garbage": {Reason.CORRUPT_PAYLOAD, Reason.INVALID_FIELD, Reason.INVALID_ID},
        "truncated": {Reason.CORRUPT_PAYLOAD},
        "invalid_field": {Reason.INVALID_FIELD, Reason.INVALID_ID},  # an empty event id: the id policy
        "unknown_fingerprint": {Reason.UNKNOWN_FINGERPRINT},
        "missing_fingerprint": {Reason.MISSING_FINGERPRINT},
    }
    for m in bad:
        result = codec.decode(m.value, [*m.headers, ("produce-ts", b"1")])
        assert isinstance(result, DecodeError), m
        assert result.reason is m.reason
        assert m.reason in expected[m.kind], m


def test_default_shares_are_small_but_present(stream: tuple) -> None:
    generator, _, emissions = stream
    config = generator.config
    counts = Counter(
        "malformed"
        if e.malformed
        else "duplicate"
        if e.duplicate
        else "late"
        if e.late
        else "ooo"
        if e.out_of_order
        else "ok"
        for e in emissions
    )
    assert counts["malformed"] / N == pytest.approx(config.malformed_share, abs=0.002)
    assert counts["duplicate"] / N == pytest.approx(config.duplicate_share, abs=0.003)
    assert counts["late"] / N == pytest.approx(config.late_share, abs=0.003)
    assert counts["ooo"] / N == pytest.approx(config.out_of_order_share, abs=0.004)


def test_replace_keeps_validation() -> None:
    with pytest.raises(ValueError, match="duplicate_share"):
        replace(GeneratorConfig(), duplicate_share=2.0)
