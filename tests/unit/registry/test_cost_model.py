"""The calibrated cost model: its terms, its constants as data, and the shape of a view."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headwater.registry.calibration import DEFAULTS, load_calibration, parse_calibration
from headwater.registry.compiled import CompiledFeature, Operand
from headwater.registry.cost import (
    HEADER_BYTES,
    SECONDS_PER_DAY,
    JobShare,
    day_tiled,
    days_read,
    estimate_footprint,
    estimate_view,
    job_share,
    shape_tiled,
    tile_days_read,
    us_per_event,
    view_shape,
    windows_tiled,
)
from headwater.registry.durations import parse_duration
from headwater.registry.expr import parse
from headwater.registry.testing import MINIMAL_VIEW, ScratchRepo
from headwater.registry.tiers import TIERS

CAL = parse_calibration(
    "nearline",
    {
        "constants": {
            "event_us": 20.0,
            "agg_us": {"count": 1.0, "top_k": 8.0},
            "where_us": 0.5,
            "pane_us": 0.01,
            "selectivity": 0.25,
            "rekey_us": 30.0,
            "fixed_cores": 0.01,
            "state_pane_bytes": 40.0,
            "state_slot_bytes": {"count": 4.0},
        },
        "machine": {"model": "Test CPU", "cores": 2},
        "measured_at": "2026-12-01",
        "command": "python bench/bench_calibrate.py",
    },
    Path("registry/calibration/nearline.json"),
)


def feature(
    name: str = "f",
    agg: str = "count",
    window: str = "1h",
    slide: str = "1m",
    where: str | None = None,
    **kw: object,
) -> CompiledFeature:
    return CompiledFeature(
        name=name,
        agg=agg,
        window=parse_duration(window),
        slide=parse_duration(slide),
        dtype="int64",
        where=parse(where) if where else None,
        where_text=where,
        **kw,  # type: ignore[arg-type]
    )


def test_us_per_event_adds_each_term() -> None:
    plain = view_shape((feature(),))
    assert us_per_event(plain, CAL) == pytest.approx(20.0 + 1.0 + 0.01 * 59)
    filtered = view_shape((feature(where="event_type = 'click'"),))
    assert us_per_event(filtered, CAL) == pytest.approx(20.0 + 0.5 + 0.25 * (1.0 + 0.01 * 59))
    rekeyed = view_shape((feature(),), rekeyed=True)
    assert us_per_event(rekeyed, CAL) - us_per_event(plain, CAL) == pytest.approx(30.0)
    topk = view_shape((feature(agg="top_k", k=3),))
    assert topk.slots == 6
    assert us_per_event(topk, CAL) == pytest.approx(20.0 + 8.0 + 0.01 * 59)


def test_a_ratio_counts_both_operands_and_their_own_filters() -> None:
    click = parse("event_type = 'click'")
    ratio = feature(
        agg="ratio",
        numerator=Operand("count", None, click, "event_type = 'click'"),
        denominator=Operand("count", None, None, None),
    )
    shape = view_shape((ratio,))
    assert shape.aggs == (("count", True, 60), ("count", False, 60))
    assert shape.filters == 1
    assert shape.slots == 1


def test_cpu_hours_follow_rate_and_fixed_cores() -> None:
    est = estimate_view((feature(),), 2000, TIERS["nearline"], calibration=CAL)
    per_event = 20.0 + 1.0 + 0.01 * 59
    assert est.cpu_hours_per_day == pytest.approx(2000 * SECONDS_PER_DAY * per_event / 3.6e9 + 0.01 * 24)
    assert "measured 2026-12-01 on Test CPU x2" in est.explain()
    double = estimate_view((feature(),), 4000, TIERS["nearline"], calibration=CAL)
    assert double.cpu_hours_per_day - est.cpu_hours_per_day == pytest.approx(
        2000 * SECONDS_PER_DAY * per_event / 3.6e9
    )


def test_the_offline_job_is_charged_every_event_of_the_window_it_reads_each_day() -> None:
    # events_for reads the longest window plus its slide, in whole days: 7d + 1d -> 8, 30d + 1d -> 31
    week = (feature(window="7d", slide="1d"), feature(name="g", window="1d", slide="1d"))
    assert days_read(view_shape(week)) == 8
    assert days_read(view_shape((feature(window="30d", slide="1d"),))) == 31
    assert days_read(view_shape((feature(window="1h", slide="1m"),))) == 1
    per_event = 20.0 + 2 * 1.0 + 0.01 * 6  # two counts; the week's 7 panes: pane_us x 6
    est = estimate_view(week, 2000, TIERS["offline"], calibration=CAL, read_days=days_read(view_shape(week)))
    assert est.read_days == 8
    assert est.events_per_day == 2000 * SECONDS_PER_DAY * 8
    assert est.cpu_hours_per_day == pytest.approx(2000 * SECONDS_PER_DAY * 8 * per_event / 3.6e9 + 0.01 * 24)
    assert "events read/day (8 days of window)" in est.explain()
    one = estimate_view(week, 2000, TIERS["offline"], calibration=CAL, read_days=1)
    assert one.events_per_day == 2000 * SECONDS_PER_DAY
    # the calibration decides by default: reads_window 1 charges the window, 0 (default) each event once.
    # A view that is not tiled (a 5 h slide: the boundary of a midnight is no midnight) re-reads its
    # window; the week above is tiled (see the next test): it reads one day and merges its tiles
    assert estimate_view(week, 2000, TIERS["offline"], calibration=CAL).read_days == 1
    windowed = parse_calibration("offline", {"constants": {"reads_window": 1}, "measured_at": "2026-12-02"})
    untiled = (feature(window="7d", slide="5h"),)
    assert days_read(view_shape(untiled)) == 8  # 7 d + 5 h: 8 partitions
    assert estimate_view(untiled, 2000, TIERS["offline"], calibration=windowed).read_days == 8
    assert estimate_view(untiled, 2000, TIERS["offline"], calibration=windowed).tile_rows_per_day == 0
    assert estimate_view(week, 2000, TIERS["offline"], calibration=windowed).read_days == 1
    # a streaming tier reads each event once, whatever the window
    assert estimate_view(week, 2000, TIERS["nearline"], calibration=CAL).read_days == 1


TILED_CAL = parse_calibration(
    "offline",
    {
        "constants": {"reads_window": 1, "event_us": 20.0, "agg_us": {"count": 1.0}, "tile_row_us": 3.0},
        "measured_at": "2026-12-04",
    },
)


def test_a_tiled_offline_view_is_charged_one_day_of_events_and_its_tile_rows() -> None:
    # every window whole days, slide 1 d: the job tiles the new day (its events) and merges the tiles
    # of its reach + 1 days (needed_days: 30 d + 1 d + 1 = 32), one row per entity and day
    month = (feature(window="30d", slide="1d"),)
    shape = view_shape(month)
    assert shape_tiled(shape)
    assert tile_days_read(shape) == 32
    est = estimate_view(month, 2000, TIERS["offline"], entities=50_000, calibration=TILED_CAL)
    assert est.read_days == 1
    assert est.events_per_day == 2000 * SECONDS_PER_DAY
    assert est.tile_rows_per_day == 50_000 * 32
    assert est.tile_row_us == 3.0
    per_event = 20.0 + 1.0  # event_us + count's agg_us; no filter, no pane term
    want = (2000 * SECONDS_PER_DAY * per_event + 50_000 * 32 * 3.0) / 3.6e9
    assert est.cpu_hours_per_day == pytest.approx(want)
    assert "1,600,000 tile rows/day x 3.00 us (tiled)" in est.explain()
    assert est.as_dict()["tile_rows_per_day"] == 1_600_000
    # from bronze (``--full``, or a caller that says what it read): the window's events, no tiles
    full = estimate_view(month, 2000, TIERS["offline"], entities=50_000, calibration=TILED_CAL, read_days=31)
    assert full.tile_rows_per_day == 0
    assert full.cpu_hours_per_day == pytest.approx(2000 * SECONDS_PER_DAY * 31 * per_event / 3.6e9)
    # a row is an (entity, day) with an event: at most a day's events; undeclared entities: that bound
    few = estimate_view(month, 0.1, TIERS["offline"], entities=50_000, calibration=TILED_CAL)
    assert few.tile_rows_per_day == pytest.approx(0.1 * SECONDS_PER_DAY * 32)
    unknown = estimate_view(month, 2000, TIERS["offline"], calibration=TILED_CAL)
    assert unknown.tile_rows_per_day == 2000 * SECONDS_PER_DAY * 32


@given(
    window_days=st.integers(1, 400),
    extra_s=st.integers(0, 86_399),
    slide_s=st.integers(1, 40 * 86_400),
    entities=st.one_of(st.none(), st.integers(1, 10**8)),
    rate=st.floats(0.001, 1e5),
)
def test_the_cost_model_charges_tiles_exactly_where_the_job_tiles(
    window_days: int, extra_s: int, slide_s: int, entities: int | None, rate: float
) -> None:
    window_s = window_days * SECONDS_PER_DAY + extra_s
    f = feature(window=f"{window_s}s", slide=f"{slide_s}s")
    shape = view_shape((f,))
    # the job's rule (pipelines/offline/tiles.py view_tiled calls windows_tiled): whole-day windows
    # whose boundary at a midnight is a midnight
    tiled = extra_s == 0 and (SECONDS_PER_DAY % slide_s == 0 or slide_s % SECONDS_PER_DAY == 0)
    assert shape_tiled(shape) == tiled == windows_tiled([(window_s, slide_s)]) == day_tiled(window_s, slide_s)
    est = estimate_view((f,), rate, TIERS["offline"], entities=entities, calibration=TILED_CAL)
    per_day = rate * SECONDS_PER_DAY
    if tiled:
        assert est.read_days == 1
        rows = min(per_day, entities if entities is not None else per_day) * (days_read(shape) + 1)
        assert est.tile_rows_per_day == pytest.approx(rows)
    else:
        assert est.read_days == days_read(shape)
        assert est.tile_rows_per_day == 0
    assert est.events_per_day == pytest.approx(per_day * est.read_days)
    assert math.isfinite(est.cpu_hours_per_day)
    assert est.cpu_hours_per_day > 0


def test_an_offline_table_is_its_rows_and_a_file_a_day_of_column_overhead() -> None:
    cal = parse_calibration(
        "offline",
        {
            "constants": {"state_pane_bytes": 6.0, "table_row_bytes": 0.0, "table_file_column_bytes": 4000.0},
            "measured_at": "2026-12-02",
        },
    )
    week = (feature(window="7d", slide="1d"), feature(name="g", window="7d", slide="1d"))
    fp = estimate_footprint(week, 2000, TIERS["offline"], 1000, 12, cal)
    # 1,000 entities x 7 days x 6 bytes + 7 day files x (2 slots + key + time) x 4,000 bytes
    assert fp.state_bytes == pytest.approx(1000 * 7 * 6.0 + 7 * 4 * 4000.0)
    assert "7 day files x 16,000 bytes" in fp.state_basis


def test_an_offline_row_holds_its_counts_entropy_its_values_and_top_k_entries() -> None:
    from headwater.registry.cost import offline_state, poisson_entropy_bits, table_row_terms

    # a Poisson count's entropy: 0 without events, 1.88 bits at a mean of 1, the normal law from 50
    assert poisson_entropy_bits(0) == 0.0
    assert poisson_entropy_bits(1) == pytest.approx(1.8825, abs=1e-4)
    assert poisson_entropy_bits(100) == pytest.approx(0.5 * math.log2(2 * math.pi * math.e * 100))
    assert poisson_entropy_bits(49.99) == pytest.approx(poisson_entropy_bits(50.0), abs=0.01)
    cal = parse_calibration(
        "offline",
        {
            "constants": {
                "state_pane_bytes": 2.0,
                "table_row_bytes": 0.0,
                "table_bit_bytes": 0.5,
                "table_value_bytes": 4.0,
                "table_entry_bytes": 2.0,
                "table_file_column_bytes": 1000.0,
            },
            "measured_at": "2026-12-02",
        },
    )
    day = (
        feature(window="1d", slide="1d"),
        feature(name="top", agg="top_k", k=2, window="1d", slide="1d"),
        feature(name="mean", agg="avg", window="1d", slide="1d"),
    )
    rate = 1000 / SECONDS_PER_DAY  # 1,000 events a day over 1,000 entities: 1 each in a day's window
    full = table_row_terms(day, rate, 1000, cal)
    assert full.count_bits == pytest.approx(1.8825, abs=1e-4)
    assert full.entries == pytest.approx(2 * (1 - math.exp(-0.5)))
    assert full.values == pytest.approx(1 - math.exp(-1))
    assert full.columns == 2 + 1 + 2 + 1  # key, time; the count; top_k's value and share; the avg
    # a lake that holds half a day: half the events in each window, smaller counts, fewer bytes
    young = table_row_terms(day, rate, 1000, cal, age_s=SECONDS_PER_DAY / 2)
    assert young.count_bits == pytest.approx(poisson_entropy_bits(0.5))
    assert young.values == pytest.approx(1 - math.exp(-0.5))
    state, basis = offline_state(day, view_shape(day), rate, 1000, cal)
    row = 2.0 + 0.5 * full.count_bits + 4.0 * full.values + 2.0 * full.entries
    assert state == pytest.approx(1000 * row + 6 * 1000.0)  # 1 day kept, one file of 6 columns
    assert "1 day files x 6,000 bytes (6 columns)" in basis
    fp = estimate_footprint(day, rate, TIERS["offline"], 1000, 12, cal, age_s=SECONDS_PER_DAY / 2)
    assert fp.state_bytes < state
    # a ratio's value costs its two counts' entropy
    ratio = feature(
        name="r",
        agg="ratio",
        window="1d",
        slide="1d",
        numerator=Operand(agg="count", field=None, where=None, where_text=None),
        denominator=Operand(agg="count", field=None, where=None, where_text=None),
    )
    assert table_row_terms((ratio,), rate, 1000, cal).count_bits == pytest.approx(2 * 1.8825, abs=1e-3)


def test_missing_constants_take_the_defaults_and_say_so() -> None:
    cal = parse_calibration("realtime", {"constants": {"event_us": 3}, "measured_at": "2026-12-01"})
    assert cal.scalar("event_us") == 3.0
    assert cal.scalar("where_us") == DEFAULTS["where_us"]
    assert "event_us" not in cal.defaulted
    assert "where_us" in cal.defaulted
    never = parse_calibration("offline", {})
    assert "never calibrated" in never.source_text()


def test_a_bad_constant_names_the_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "nearline.json"
    with pytest.raises(ValueError, match=r"nearline.json: constants.agg_us must map"):
        parse_calibration("nearline", {"constants": {"agg_us": 3}}, path)
    with pytest.raises(ValueError, match=r"constants.event_us must be a number, got 'fast'"):
        parse_calibration("nearline", {"constants": {"event_us": "fast"}}, path)


def test_every_tier_has_a_calibration_file_with_its_provenance() -> None:
    for tier in TIERS:
        cal = load_calibration(tier)
        assert cal.path is not None
        assert cal.path.name == f"{tier}.json"
        if cal.measured_at:
            assert cal.command
            assert cal.machine.get("model")
            assert cal.machine.get("cores")
        else:
            assert "NOT MEASURED" in cal.source_text()


def test_check_reads_the_calibration(repo: ScratchRepo) -> None:
    repo.write("v1.yaml", MINIMAL_VIEW)
    (view,) = repo.check().views
    expected = estimate_view(view.features, 2000, TIERS["realtime"])
    assert view.estimated_cost == pytest.approx(expected.cpu_hours_per_day)
    assert expected.calibration == load_calibration("realtime").source_text()


def test_state_counts_live_entities_and_slices() -> None:
    fp = estimate_footprint((feature(window="1h", slide="1m"),), 10, TIERS["nearline"], 100, 12, CAL)
    # 10 events/s x 3600 s over 100 entities = 360 events each: nearly every one of the 61 panes
    assert fp.entities == 100
    assert fp.state_bytes == pytest.approx(100 * 61 * -math.expm1(-360 / 61) * (40 + 4))
    assert fp.state_bytes == pytest.approx(100 * 61 * (40 + 4), rel=0.01)
    sparse = estimate_footprint((feature(window="1h", slide="1m"),), 0.01, TIERS["nearline"], 100, 12, CAL)
    # 36 events an hour over 100 entities: about 36 records, one an event
    assert sparse.entities == pytest.approx(36)
    assert sparse.state_bytes == pytest.approx(36 * 1 * 44, rel=0.01)


def test_a_rekeyed_nearline_view_keeps_its_ids_twice_and_counter_maps_an_entry_a_value() -> None:
    cal = parse_calibration(
        "nearline",
        {
            "constants": {
                "state_pane_bytes": 40.0,
                "state_slot_bytes": {"count": 4.0, "distinct_count": 30.0},
                "state_dedup_id_bytes": 45.0,
                "state_running_event_bytes": {"distinct_count": 16.0},
            },
            "measured_at": "2026-12-02",
        },
        Path("registry/calibration/nearline.json"),
    )
    tier = TIERS["nearline"]
    count = (feature(window="1h", slide="1m"),)
    plain = estimate_footprint(count, 10, tier, 100, 12, cal, dedup_window_s=120)
    rekeyed = estimate_footprint(count, 10, tier, 100, 12, cal, dedup_window_s=120, rekeyed=True)
    # 10 events/s x 120 s = 1,200 ids; the repartitioned leg's store keeps another 1,200
    assert rekeyed.state_bytes - plain.state_bytes == pytest.approx(1200 * 45.0)
    assert "x 2: the repartitioned leg" in rekeyed.state_basis
    # a distinct_count's map: its records' first values in state_slot_bytes, every further event
    # of the window an entry (36,000 events in 100 x 61 records)
    distinct = (feature(agg="distinct_count", field="account_id", window="1h", slide="1m"),)
    fp = estimate_footprint(distinct, 10, tier, 100, 12, cal)
    records = 100 * 61 * -math.expm1(-360 / 61)
    assert fp.state_bytes == pytest.approx(records * (40 + 30) + (36_000 - records) * 16.0)
    assert "bytes of counter-map entries" in fp.state_basis
    # a count has no map: no entries
    assert "counter-map" not in estimate_footprint(count, 10, tier, 100, 12, cal).state_basis


def test_online_memory_is_header_slots_and_key_per_entity() -> None:
    fp = estimate_footprint((feature(agg="top_k", k=2),), 100, TIERS["realtime"], 1000, 12, CAL)
    per_key = fp.online_bytes / 1000
    assert per_key > HEADER_BYTES + 4 * 4
    assert "72 header + 4 x 4 slots" in fp.online_basis


@given(
    rate=st.floats(0.001, 1e6),
    entities=st.one_of(st.none(), st.integers(1, 10**9)),
    window_s=st.integers(1, 90 * 86400),
    slide_div=st.integers(1, 1000),
)
def test_estimates_are_finite_non_negative_and_monotone_in_rate(
    rate: float, entities: int | None, window_s: int, slide_div: int
) -> None:
    slide_s = max(1, window_s // slide_div)
    f = feature(window=f"{window_s}s", slide=f"{slide_s}s")
    for tier in TIERS.values():
        one = estimate_view((f,), rate, tier, entities=entities, calibration=CAL)
        two = estimate_view((f,), rate * 2, tier, entities=entities, calibration=CAL)
        assert math.isfinite(one.cpu_hours_per_day)
        assert one.cpu_hours_per_day >= 0
        assert two.cpu_hours_per_day >= one.cpu_hours_per_day
        fp = estimate_footprint((f,), rate, tier, entities, 12, CAL)
        assert math.isfinite(fp.state_bytes)
        assert fp.state_bytes >= 0
        assert fp.online_bytes >= 0
        if entities is not None:
            assert fp.entities <= entities


JOB_CAL = parse_calibration(
    "realtime",
    {
        "constants": {
            "event_us": 2.0,
            "agg_us": {"count": 1.0},
            "fixed_cores": 0.01,
            "job_fixed_cores": 0.2,
            "job_event_us": 5.0,
            "group_fixed_cores": 0.04,
        },
        "measured_at": "2026-12-01",
    },
    Path("registry/calibration/realtime.json"),
)


def test_job_share_counts_the_views_of_the_job_and_of_the_group() -> None:
    views = [("realtime", "events", "user"), ("realtime", "events", "user"), ("realtime", "events", "item"),
             ("realtime", "payments", "account"), ("nearline", "events", "user")]  # fmt: skip
    assert job_share(views, "realtime", "events", "user") == JobShare(job_views=3, group_views=2)
    assert job_share(views, "realtime", "events", "item") == JobShare(job_views=3, group_views=1)
    assert job_share(views, "realtime", "payments", "account") == JobShare()
    assert job_share([], "offline", "events", "user") == JobShare()


def test_a_jobs_views_together_are_charged_the_job_once() -> None:
    rate, tier = 1000.0, TIERS["realtime"]
    f = (feature(window="5m", slide="1s"),)
    alone = estimate_view(f, rate, tier, calibration=JOB_CAL)
    job_cores = 0.2 + rate * 5.0 / 1e6
    marginal = (rate * SECONDS_PER_DAY * 3.0) / 1e6 / 3600 + 0.01 * 24
    assert alone.marginal_cpu_hours == pytest.approx(marginal)
    assert alone.cpu_hours_per_day == pytest.approx(marginal + (job_cores + 0.04) * 24)
    # three views of one source, two keyed by user (one group), one by item (another group)
    shares = [JobShare(3, 2), JobShare(3, 2), JobShare(3, 1)]
    total = sum(estimate_view(f, rate, tier, calibration=JOB_CAL, share=s).cpu_hours_per_day for s in shares)
    assert total == pytest.approx(3 * marginal + (job_cores + 2 * 0.04) * 24)
    shared = estimate_view(f, rate, tier, calibration=JOB_CAL, share=shares[0])
    assert "1/3 of the job's" in shared.explain()
    assert shared.as_dict()["job_views"] == 3


def test_check_splits_the_job_among_the_views_of_a_source(repo: ScratchRepo) -> None:
    repo.write("v1.yaml", MINIMAL_VIEW)
    repo.write("v2.yaml", MINIMAL_VIEW.replace("feature_view: v1", "feature_view: v2"))
    views = repo.check().views
    assert len(views) == 2
    for view in views:
        expected = estimate_view(view.features, 2000, TIERS["realtime"], share=JobShare(2, 2))
        assert view.estimated_cost == pytest.approx(expected.cpu_hours_per_day)


RT_CAL = parse_calibration(
    "realtime",
    {
        "constants": {
            "selectivity": 0.5,
            "state_entity_bytes": 32.0,
            "state_view_bytes": 13.0,
            "state_value_slot_bytes": 5.0,
            "state_running_bytes": {"count": 13.0, "max": 5.0},
            "state_running_event_bytes": {"max": 16.0},
            "state_pane_bytes": 17.0,
            "state_slot_bytes": {"count": 13.0, "max": 13.0},
            "state_dedup_id_bytes": 8.0,
        },
        "measured_at": "2026-12-02",
        "where_shares": [
            {"where": "event_type = 'click'", "share": 0.1, "bursts": {"user_id": 1.0}},
            {"where": "event_type = 'impression'", "share": 0.8, "bursts": {"user_id": 8.0}},
        ],
        "stream_profile": {"events": {"user_id": {"deciles": [0.1] * 10, "burst": 4.0}}},
    },
    Path("registry/calibration/realtime.json"),
)


def test_a_filters_share_is_measured_however_it_is_spelled_else_the_selectivity() -> None:
    assert RT_CAL.share(parse("event_type='click'")) == pytest.approx(0.1)
    assert RT_CAL.share(parse("(event_type = 'click')")) == pytest.approx(0.1)
    assert RT_CAL.share(parse("event_type = 'like'")) == pytest.approx(0.5)
    assert RT_CAL.share(None) == 1.0
    assert RT_CAL.burst(parse("event_type = 'impression'"), ("events", "user_id")) == 8.0
    assert RT_CAL.burst(None, ("events", "user_id")) == 4.0
    assert RT_CAL.burst(None, None) == 1.0


def test_a_view_is_hit_by_its_filters_shares_without_counting_an_implied_filter_twice() -> None:
    click = feature("a", where="event_type = 'click'")
    click_cat = feature("b", where="event_type = 'click' and category is not null")
    impression = feature("c", where="event_type = 'impression'")
    assert view_shape((click, click_cat, impression)).hit_share(RT_CAL) == pytest.approx(0.9)
    # runs of hit events: clicks alone, impressions 8 at a time: 0.9 / (0.1 / 1 + 0.8 / 8)
    assert view_shape((click, impression)).hit_burst(RT_CAL, ("events", "user_id")) == pytest.approx(4.5)
    assert view_shape((click, feature("d"))).hit_share(RT_CAL) == 1.0


def test_realtime_state_follows_the_operators_layout() -> None:
    # one unfiltered count over 1 min of 1 s slices, 100 entities, 1 event/s, each alone (no profile)
    f = (feature(window="1m", slide="1s"),)
    cal = parse_calibration("realtime", {"constants": RT_CAL.constants, "measured_at": "2026-12-02"})
    fp = estimate_footprint(f, 1.0, TIERS["realtime"], 100, 12, cal)
    runs = 60 / 100  # events of an entity in the window
    live = 100 * -math.expm1(-runs)
    slices = 100 * 61 * -math.expm1(-runs / 61)
    entity = 32 + 12 + 13 + 5 * 1 + 13  # header + key + view value + one slot + count's running
    expected = live * entity + slices * (17 + 1) + slices * (13 - 1) + 60 * 8
    assert fp.state_bytes == pytest.approx(expected)
    assert "live entities" in fp.state_basis


def test_bursts_and_uneven_entities_mean_fewer_slices_and_live_entities() -> None:
    f = (feature(where="event_type = 'impression'", window="5m", slide="1s"),)
    tier = TIERS["realtime"]
    even = parse_calibration("realtime", {"constants": RT_CAL.constants, "measured_at": "2026-12-02"})
    alone = estimate_footprint(f, 20.0, tier, 1000, 12, even, stream=("events", "user_id"))
    bursts = estimate_footprint(f, 20.0, tier, 1000, 12, RT_CAL, stream=("events", "user_id"))
    assert bursts.state_bytes < alone.state_bytes
    skewed = parse_calibration(
        "realtime",
        {
            "constants": RT_CAL.constants,
            "where_shares": [{"where": "event_type = 'impression'", "share": 0.8}],
            "stream_profile": {"events": {"user_id": {"deciles": [0.91] + [0.01] * 9}}},
        },
    )
    flat = parse_calibration(
        "realtime",
        {
            "constants": RT_CAL.constants,
            "where_shares": [{"where": "event_type = 'impression'", "share": 0.8}],
        },
    )
    few = estimate_footprint(f, 1.0, tier, 1000, 12, skewed, stream=("events", "user_id"))
    many = estimate_footprint(f, 1.0, tier, 1000, 12, flat, stream=("events", "user_id"))
    assert few.state_bytes < many.state_bytes


def test_a_bad_stream_profile_or_share_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "realtime.json"
    with pytest.raises(ValueError, match=r"realtime.json: stream_profile.events.user_id must be"):
        parse_calibration("realtime", {"stream_profile": {"events": {"user_id": {"deciles": [1.0]}}}}, path)
    with pytest.raises(ValueError, match=r"realtime.json: where_shares\[0\] must be"):
        parse_calibration("realtime", {"where_shares": [{"where": "x = 1", "share": 2}]}, path)
    with pytest.raises(ValueError, match=r"cannot parse the filter"):
        parse_calibration("realtime", {"where_shares": [{"where": "x = = 1", "share": 0.5}]}, path)


def occupancy(runs: float, panes: float, entities: float = 100) -> float:
    """(entity, pane) records of ``runs`` visits over ``entities`` even entities and ``panes`` panes."""
    return entities * panes * -math.expm1(-runs / entities / panes)


def test_a_nearline_record_lives_as_long_as_a_window_on_its_start_needs_it_and_slides_share_a_start() -> None:
    tier = TIERS["nearline"]
    hour = feature("h", window="1h", slide="1m")
    day = feature("d", window="24h", slide="10m")
    fp = estimate_footprint((hour, day), 0.01, tier, 100, 12, CAL)
    # a record lives while a feature whose slide divides its start needs it (task._expire): the 1-min
    # route's records live 1 h (36 events over 61 panes), those of its starts on the 10-min grid (a
    # tenth) 24 h (864 events over 1,441 panes); the 10-min route's 24 h (145 panes)
    short, kept, ten = occupancy(36, 61), occupancy(864, 1441), occupancy(864, 145)
    minute = short * 0.9 + kept * 0.1
    # the minute records on a ten-minute start are the ten-minute route's: one record there, not two
    records = minute + ten - kept * 0.1
    assert fp.state_bytes == pytest.approx(records * 40 + (minute + ten) * 4)
    # a longer route that does not keep every event of the shorter one shares nothing
    clicks = feature("d", window="24h", slide="10m", where="event_type = 'click'")
    apart = estimate_footprint((hour, clicks), 0.01, tier, 100, 12, CAL)
    shown = 864 * 0.25  # the click filter keeps CAL's selectivity
    assert apart.state_bytes == pytest.approx((minute + occupancy(shown, 145)) * (40 + 4))
    # before (every record until the view's longest window dropped it) the 1-min route held 24 h
    assert fp.state_bytes < (occupancy(864, 1441) + ten - occupancy(864, 1441) * 0.1) * 40 + (kept + ten) * 4


def test_a_nearline_stream_younger_than_the_window_holds_its_age() -> None:
    tier = TIERS["nearline"]
    day = (feature(window="24h", slide="10m"),)
    fp = estimate_footprint(day, 0.01, tier, 100, 12, CAL, age_s=300)
    # 3 events in 300 s, over 300 / 600 + 1 = 1.5 pane starts on average
    assert fp.state_bytes == pytest.approx(occupancy(3, 1.5) * 44)


def test_a_visit_brings_several_events_to_a_pane_as_measured_per_filter_set_and_slide(tmp_path: Path) -> None:
    data = {
        "constants": {"state_pane_bytes": 40.0, "state_slot_bytes": {"count": 4.0}},
        "where_shares": [{"where": "event_type = 'click'", "share": 0.5, "bursts": {"user_id": 1.0}}],
        "pane_bursts": [
            {
                "source": "events",
                "where": ["event_type = 'click'"],
                "key": "user_id",
                "slides": {"60": 2, "600": 4},
            }
        ],
    }
    cal = parse_calibration("nearline", data, tmp_path / "nearline.json")
    click = parse("(event_type = 'click')")  # spelled otherwise: the same filter
    stream = ("events", "user_id")
    assert cal.pane_burst([click], stream, 60) == 2.0
    assert cal.pane_burst([click], stream, 300) == 2.0  # not measured: the longest measured below it
    assert cal.pane_burst([click], stream, 3600) == 4.0
    assert cal.pane_burst([click], stream, 10) is None  # below every measured slide: the run burst
    assert cal.pane_burst([None], stream, 60) is None  # another filter set: not measured
    assert cal.pane_burst([click], ("events", "item_id"), 60) is None
    assert cal.pane_burst([click], None, 60) is None
    f = (feature(window="1h", slide="1m", where="event_type = 'click'"),)
    fp = estimate_footprint(f, 0.1, TIERS["nearline"], 100, 12, cal, stream=stream)
    # 180 clicks an hour come as 90 visits of 2 over 61 panes
    assert fp.state_bytes == pytest.approx(occupancy(90, 61) * 44)
    with pytest.raises(ValueError, match=r"nearline.json: pane_bursts\[0\] must be"):
        parse_calibration(
            "nearline",
            {"pane_bursts": [{"where": "x = 1", "key": "k", "slides": {}}]},
            tmp_path / "nearline.json",
        )
    with pytest.raises(ValueError, match=r"pane_bursts\[0\] must be"):
        parse_calibration(
            "nearline",
            {"pane_bursts": [{"where": [], "key": "k", "slides": {"60": 0.5}}]},
            tmp_path / "nearline.json",
        )


def test_an_offline_run_pays_seconds_for_a_counter_map_and_for_each_window_length() -> None:
    cal = parse_calibration(
        "offline",
        {
            "constants": {
                "event_us": 0.0,
                "fixed_cores": 10 / SECONDS_PER_DAY,
                "run_counter_s": 11.0,
                "run_window_s": 5.0,
            },
            "measured_at": "2026-12-02",
        },
    )
    tier = TIERS["offline"]
    counts = (feature(window="7d", slide="1d"), feature(name="g", window="30d", slide="1d"))
    # no events charged: 10 s a run + 2 windows x 5 s = 20 CPU s a day
    assert estimate_view(counts, 0, tier, calibration=cal).cpu_hours_per_day * 3600 == pytest.approx(20.0)
    mapped = (*counts, feature(name="u", agg="distinct_count", field="user_id", window="7d", slide="1d"))
    # a counter map's own pipeline: 11 s more, whatever the number of maps; its window is not new
    assert estimate_view(mapped, 0, tier, calibration=cal).cpu_hours_per_day * 3600 == pytest.approx(31.0)
    # the streaming tiers' calibrations have neither term
    assert estimate_view(mapped, 0, TIERS["nearline"], calibration=CAL).fixed_cores == CAL.scalar(
        "fixed_cores"
    )
