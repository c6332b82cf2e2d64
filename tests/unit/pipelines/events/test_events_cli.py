from pathlib import Path

import pytest
from click.testing import CliRunner

from headwater.cli.events import events
from headwater.cli.registry import apply
from headwater.pipelines.events.producer import ProducerSettings, ProduceStats
from headwater.pipelines.events.tail import TailSummary

EXAMPLE = Path(__file__).resolve().parents[4] / "features"


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


# --- bring your own data: errors before any broker is needed -------------------------------------


@pytest.fixture(scope="module")
def applied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state folder with the example repo applied (plans only)."""
    state = tmp_path_factory.mktemp("state")
    result = CliRunner().invoke(apply, [str(EXAMPLE), "--state-dir", str(state), "--no-feast"])
    assert result.exit_code == 0, result.output
    return state


def produce_args(state: Path, *args: str) -> list[str]:
    return ["produce", "--state-dir", str(state), "--bootstrap", "127.0.0.1:1", *args]


def test_produce_help_shows_the_file_options() -> None:
    result = CliRunner().invoke(events, ["produce", "--help"])
    for option in (
        "--source",
        "--from",
        "--format",
        "--reject-file",
        "--rejects-to",
        "--time-shift",
        "--pace",
    ):
        assert option in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from", "rows.jsonl"], "--from FILE needs --source NAME"),
        (["--time-shift", "to-now"], "--time-shift only apply with --from FILE"),
        (["--source", "payments", "--reject-file", "r.jsonl"], "--reject-file only apply with --from FILE"),
        (
            ["--source", "payments", "--from", "x.jsonl", "--late-share", "0.1"],
            "--late-share only shape the behaviour generator",
        ),
        (["--source", "payments", "--malformed-share", "0.1"], "not random events of source 'payments'"),
        (
            ["--source", "payments", "--from", "x.jsonl", "--time-shift", "soon"],
            "--time-shift 'soon': expected to-now",
        ),
    ],
)
def test_contradictory_options_are_usage_errors(applied: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(events, produce_args(applied, *args))
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_unknown_source_names_those_there_and_the_fix(applied: Path) -> None:
    result = CliRunner().invoke(events, produce_args(applied, "--source", "orders", "--from", "x.jsonl"))
    assert result.exit_code == 1
    assert "source 'orders' is not in the applied plan (sources: events, payments)" in result.output
    assert "headwater apply" in result.output
    tailed = CliRunner().invoke(events, ["tail", "--state-dir", str(applied), "--source", "orders"])
    assert tailed.exit_code == 1
    assert "source 'orders' is not in the applied plan" in tailed.output


def test_no_applied_plan_says_where_it_looked(tmp_path: Path) -> None:
    result = CliRunner().invoke(events, produce_args(tmp_path, "--source", "payments", "--from", "x.jsonl"))
    assert result.exit_code == 1
    assert f"no offline plan at {tmp_path}" in result.output
    assert "--state-dir" in result.output


def test_a_missing_or_unreadable_file_is_named_before_connecting(applied: Path, tmp_path: Path) -> None:
    missing = tmp_path / "absent.jsonl"
    result = CliRunner().invoke(events, produce_args(applied, "--source", "payments", "--from", str(missing)))
    assert result.exit_code == 1
    assert f"{missing}: no such file" in result.output
    odd = tmp_path / "rows.xls"
    odd.write_text("x")
    result = CliRunner().invoke(events, produce_args(applied, "--source", "payments", "--from", str(odd)))
    assert result.exit_code == 1
    assert "cannot tell the format from the extension" in result.output


def test_the_behaviour_generator_serves_the_behaviour_schema_only(applied: Path) -> None:
    from headwater.cli.events import _is_behaviour
    from headwater.registry.plans import read_plan

    sources = {s.name: s for s in read_plan(applied, "offline").sources}
    assert _is_behaviour(sources["events"])
    assert not _is_behaviour(sources["payments"])
