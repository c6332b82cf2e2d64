from click.testing import CliRunner

from headwater.pipelines.events.cli import events
from headwater.pipelines.events.producer import ProducerSettings, ProduceStats
from headwater.pipelines.events.tail import TailSummary


def test_help_lists_produce_and_tail() -> None:
    result = CliRunner().invoke(events, ["--help"])
    assert result.exit_code == 0
    assert "produce" in result.output
    assert "tail" in result.output
    produce_help = CliRunner().invoke(events, ["produce", "--help"])
    assert "--rate" in produce_help.output
    assert "--malformed-share" in produce_help.output
    tail_help = CliRunner().invoke(events, ["tail", "--help"])
    for option in ("--max", "--from-beginning", "--timeout", "--summary-only"):
        assert option in tail_help.output


def test_impossible_shares_are_a_usage_error_before_any_connection() -> None:
    result = CliRunner().invoke(
        events,
        ["produce", "--late-share", "0.7", "--out-of-order-share", "0.7", "--bootstrap", "127.0.0.1:1"],
    )
    assert result.exit_code == 2
    assert "late_share + out_of_order_share: expected a value in [0.0, 1.0], found 1.4" in result.output


def test_out_of_range_option_is_rejected_by_click() -> None:
    result = CliRunner().invoke(events, ["produce", "--malformed-share", "1.5"])
    assert result.exit_code == 2
    assert "--malformed-share" in result.output


def test_durable_settings_are_idempotent_and_acks_one_is_not() -> None:
    durable = ProducerSettings(bootstrap="b:1", topic="t").kafka_config()
    assert durable["acks"] == "all"
    assert durable["enable_idempotence"] is True
    assert durable["compression_type"] == "zstd"
    assert durable["allow_auto_create_topics"] is False
    fast = ProducerSettings(bootstrap="b:1", topic="t", acks="1", compression="none").kafka_config()
    assert fast["acks"] == 1
    assert fast["enable_idempotence"] is False
    assert fast["compression_type"] is None


def test_stats_rate_and_summary_percentiles() -> None:
    stats = ProduceStats(sent=5_000, malformed=10, elapsed_s=2.0)
    assert stats.rate == 2_500
    assert stats.as_dict()["rate"] == 2_500.0
    assert ProduceStats().rate == 0.0
    summary = TailSummary(records=3, ages_ms=list(range(1, 101)))
    summary.by_type["click"] = 2
    summary.invalid["corrupt_payload"] = 1
    data = summary.as_dict()
    assert data["valid"] == 2
    assert data["invalid"] == {"corrupt_payload": 1}
    assert data["age_ms_p50"] == 51
    assert data["age_ms_p99"] == 100
