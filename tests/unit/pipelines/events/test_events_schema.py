"""The example behaviour source (pipelines/events/schema.py) and the Avro rules under every source.

``behavior_source()`` is the plan form of the example repo's ``events`` source; registry/avro.py
parses a schema file into fields, fingerprints it, and says what a schema change breaks.
"""

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import fastavro
import pytest
from fastavro.schema import to_parsing_canonical_form

from headwater.pipelines.events.schema import (
    BEHAVIOR_SOURCE,
    DEVICES,
    EVENT_TYPES,
    EXAMPLE_REPO_ENV,
    FIELD_NAMES,
    ExampleRepoError,
    behavior_source,
    event_datetime,
    example_repo,
)
from headwater.registry import avro
from headwater.registry.avro import (
    EventField,
    compatibility_problems,
    load_event_schema,
    parse_event_schema,
)
from headwater.registry.avro import (
    SchemaError as AvroSchemaError,
)

EXAMPLE = Path(__file__).resolve().parents[4] / "features"
BEHAVIOR_AVSC = EXAMPLE / "schemas/behavior_event.avsc"

# The fingerprint of features/schemas/behavior_event.avsc as committed. It changes only when
# the canonical form changes (fields, types, names; not docs): then every consumer must be
# upgraded before the producer, so update this value deliberately and tell the lead.
PINNED_FINGERPRINT = "9b1c41fd8f13e589"
V1_FINGERPRINT = "5335328fdc7bb5ab"
"""Version 1 (``behavior_event.v1.avsc``), before the nullable experiment ``arm`` (issue 20)."""


def test_behavior_source_is_the_example_events_source() -> None:
    source = behavior_source()
    assert source.name == BEHAVIOR_SOURCE == "events"
    assert source.topic == "events"
    assert [s.fingerprint for s in source.schemas] == [V1_FINGERPRINT, PINNED_FINGERPRINT]
    assert source.current.fingerprint == PINNED_FINGERPRINT
    assert [f.name for f in source.fields] == list(FIELD_NAMES)
    assert (source.event_time, source.key, source.event_id) == ("event_time", "user_id", "event_id")
    assert source.event_time_unit == "ms"
    assert source.max_out_of_orderness_ms == 5_000
    assert source.allowed_lateness_ms == 60_000
    assert source.max_future_ms == 300_000
    assert source.min_event_time_ms == 946_684_800_000  # 2000-01-01, the registry default
    assert len(source.rules) == 7


def test_behavior_source_enums_match_the_typed_record() -> None:
    source = behavior_source()
    event_type = source.field("event_type")
    device = source.field("device")
    assert event_type is not None
    assert device is not None
    assert (event_type.kind, tuple(event_type.symbols)) == ("enum", EVENT_TYPES)
    assert (device.kind, tuple(device.symbols)) == ("enum", DEVICES)
    price = source.field("price")
    assert price is not None
    assert (price.kind, price.nullable) == ("double", True)
    assert source.field("colour") is None


def test_behavior_source_is_checked_once_per_folder() -> None:
    assert behavior_source() is behavior_source()
    assert behavior_source(EXAMPLE) is behavior_source()


def test_env_variable_points_at_another_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "features"
    shutil.copytree(EXAMPLE, copy)
    monkeypatch.setenv(EXAMPLE_REPO_ENV, str(copy))
    assert example_repo() == copy
    assert behavior_source().current.fingerprint == PINNED_FINGERPRINT


def test_a_repo_without_the_events_source_names_the_problem(tmp_path: Path) -> None:
    copy = tmp_path / "features"
    shutil.copytree(EXAMPLE, copy)
    (copy / "schemas/behavior_event.avsc").write_text("{ not json")
    with pytest.raises(
        ExampleRepoError, match=r"source 'events' does not check: .*behavior_event\.avsc is not JSON"
    ):
        behavior_source(copy)


def test_fingerprint_is_crc64_of_the_canonical_form_of_the_file() -> None:
    raw = json.loads(BEHAVIOR_AVSC.read_text())
    expected = fastavro.schema.fingerprint(
        to_parsing_canonical_form(fastavro.parse_schema(raw)), "CRC-64-AVRO"
    )
    assert expected == PINNED_FINGERPRINT
    assert avro.fingerprint(raw) == PINNED_FINGERPRINT
    assert load_event_schema(BEHAVIOR_AVSC).fingerprint == PINNED_FINGERPRINT


def test_docs_do_not_change_the_fingerprint_but_types_do() -> None:
    raw = json.loads(BEHAVIOR_AVSC.read_text())
    raw["doc"] = "another description"
    assert parse_event_schema(json.dumps(raw), Path("docs.avsc")).fingerprint == PINNED_FINGERPRINT
    raw["fields"][8]["type"] = ["null", "int"]  # dwell_ms: long -> int
    assert parse_event_schema(json.dumps(raw), Path("types.avsc")).fingerprint != PINNED_FINGERPRINT


def test_parse_types_every_field() -> None:
    schema = load_event_schema(BEHAVIOR_AVSC)
    assert list(schema.fields) == list(FIELD_NAMES)
    assert schema.fields["event_time"] == EventField("event_time", "timestamp", time_unit="ms")
    assert schema.fields["item_id"] == EventField("item_id", "string", nullable=True, has_default=True)
    assert schema.fields["device"].symbols == DEVICES
    payments = load_event_schema(EXAMPLE / "schemas/payment_event.avsc")
    assert payments.fields["occurred_at"].time_unit == "us"
    assert payments.fields["risk_score"].describe() == "double|null"


def test_invalid_json_names_the_line() -> None:
    with pytest.raises(AvroSchemaError, match=r"bad\.avsc is not JSON: .* at line 3") as info:
        parse_event_schema('{\n  "type": "record",\n  "name": oops\n}', Path("bad.avsc"))
    assert info.value.line == 3


def test_not_a_record_is_rejected() -> None:
    with pytest.raises(AvroSchemaError, match="is not a record schema"):
        parse_event_schema('["null", "string"]', Path("list.avsc"))


def test_unsupported_type_names_field_and_line() -> None:
    raw = '{"type": "record", "name": "E", "fields": [\n  {"name": "a", "type": "string"},\n'
    raw += '  {"name": "tags", "type": {"type": "array", "items": "string"}}\n]}'
    with pytest.raises(AvroSchemaError, match=r"field 'tags' in x\.avsc: unsupported Avro type") as info:
        parse_event_schema(raw, Path("x.avsc"))
    assert (info.value.line, info.value.field) == (3, "tags")


def test_non_utf8_schema_file_is_a_schema_error(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.avsc"
    bad.write_bytes(b'{"type": "record", "name": "caf\xe9", "fields": []}')
    with pytest.raises(AvroSchemaError, match="not UTF-8 text"):
        load_event_schema(bad)


def _variant(
    change: dict[str, object] | None = None, add: dict[str, object] | None = None
) -> avro.EventSchema:
    raw = json.loads(BEHAVIOR_AVSC.read_text())
    for entry in raw["fields"]:
        if change and entry["name"] in change:
            entry["type"] = change[entry["name"]]
            if not isinstance(entry["type"], list):
                entry.pop("default", None)  # a null default needs a union with null
    if add:
        raw["fields"].append(add)
    return parse_event_schema(json.dumps(raw), Path("v2.avsc"))


def test_compatible_changes_have_no_problems() -> None:
    old = load_event_schema(BEHAVIOR_AVSC)
    added = _variant(add={"name": "locale", "type": ["null", "string"], "default": None})
    assert compatibility_problems(old, added) == []
    promoted = _variant(change={"position": ["null", "long"]})
    assert compatibility_problems(old, promoted) == []


def test_incompatible_changes_name_field_and_fix() -> None:
    old = load_event_schema(BEHAVIOR_AVSC)
    [problem] = compatibility_problems(old, _variant(add={"name": "locale", "type": "string"}))
    assert (problem.field, problem.problem) == ("locale", "added without a default")
    assert '"default": null' in problem.fix
    [narrowed] = compatibility_problems(old, _variant(change={"dwell_ms": ["null", "int"]}))
    assert narrowed.field == "dwell_ms"
    [required] = compatibility_problems(old, _variant(change={"query": "string"}))
    assert "was nullable" in required.problem
    symbols = {"type": "enum", "name": "Device", "symbols": ["ios", "android"]}
    [removed] = compatibility_problems(old, _variant(change={"device": symbols}))
    assert removed.field == "device"


def test_event_datetime_is_timezone_aware_utc() -> None:
    event = {"event_time": 1_767_225_600_123}
    assert event_datetime(event) == datetime(2026, 1, 1, 0, 0, 0, 123_000, tzinfo=UTC)  # type: ignore[arg-type]
