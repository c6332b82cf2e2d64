import json
from datetime import UTC, datetime
from pathlib import Path

import fastavro
import pytest
from fastavro.schema import fingerprint, to_parsing_canonical_form

from headwater.pipelines.events.schema import (
    DEFAULT_SCHEMA_PATH,
    DEVICES,
    EVENT_TYPES,
    FIELD_NAMES,
    SCHEMA_ENV,
    SchemaError,
    event_datetime,
    load_schema,
)

# The fingerprint of features/schemas/behavior_event.avsc as committed. It changes only when
# the canonical form changes (fields, types, names; not docs): then every consumer must be
# upgraded before the producer, so update this value deliberately and tell the lead.
PINNED_FINGERPRINT = "5335328fdc7bb5ab"


def test_schema_loads_from_the_repo_with_a_stable_fingerprint() -> None:
    schema = load_schema()
    assert schema.path == DEFAULT_SCHEMA_PATH.resolve()
    assert schema.raw["name"] == "BehaviorEvent"
    assert [f["name"] for f in schema.raw["fields"]] == list(FIELD_NAMES)
    assert schema.fingerprint == PINNED_FINGERPRINT
    assert schema.fingerprint_header == PINNED_FINGERPRINT.encode("ascii")


def test_fingerprint_is_crc64_of_the_canonical_form_of_the_file() -> None:
    raw = json.loads(DEFAULT_SCHEMA_PATH.read_text())
    expected = fingerprint(to_parsing_canonical_form(fastavro.parse_schema(raw)), "CRC-64-AVRO")
    assert load_schema().fingerprint == expected


def test_docs_do_not_change_the_fingerprint_but_types_do(tmp_path: Path) -> None:
    raw = json.loads(DEFAULT_SCHEMA_PATH.read_text())
    raw["doc"] = "another description"
    same = tmp_path / "docs.avsc"
    same.write_text(json.dumps(raw))
    raw["fields"][8]["type"] = ["null", "int"]  # dwell_ms: long -> int
    other = tmp_path / "types.avsc"
    other.write_text(json.dumps(raw))
    assert load_schema(same).fingerprint == PINNED_FINGERPRINT
    assert load_schema(other).fingerprint != PINNED_FINGERPRINT


def test_schema_is_parsed_once_per_path() -> None:
    assert load_schema() is load_schema()
    assert load_schema(DEFAULT_SCHEMA_PATH) is load_schema()


def test_wire_schema_reads_event_time_as_int_ms() -> None:
    fields = {f["name"]: f["type"] for f in load_schema().wire["fields"]}
    assert fields["event_time"] == {"type": "long"}
    assert tuple(load_schema().raw["fields"][3]["type"]["symbols"]) == EVENT_TYPES
    assert tuple(load_schema().raw["fields"][11]["type"]["symbols"]) == DEVICES


def test_env_variable_overrides_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "copy.avsc"
    copy.write_text(DEFAULT_SCHEMA_PATH.read_text())
    monkeypatch.setenv(SCHEMA_ENV, str(copy))
    assert load_schema().path == copy.resolve()


def test_missing_file_names_the_path_and_the_fix(tmp_path: Path) -> None:
    missing = tmp_path / "nope.avsc"
    with pytest.raises(SchemaError, match=r"not found at .*nope\.avsc.*HEADWATER_EVENT_SCHEMA"):
        load_schema(missing)


def test_invalid_json_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.avsc"
    bad.write_text('{\n  "type": "record",\n  "name": oops\n}')
    with pytest.raises(SchemaError, match=r"bad\.avsc:3:\d+: event schema is not valid JSON"):
        load_schema(bad)


def test_not_a_record_is_rejected(tmp_path: Path) -> None:
    bad = tmp_path / "list.avsc"
    bad.write_text('["null", "string"]')
    with pytest.raises(SchemaError, match="expected an Avro record schema"):
        load_schema(bad)


def test_symbols_that_disagree_with_the_code_are_rejected(tmp_path: Path) -> None:
    raw = json.loads(DEFAULT_SCHEMA_PATH.read_text())
    raw["fields"][3]["type"]["symbols"].append("bookmark")
    bad = tmp_path / "symbols.avsc"
    bad.write_text(json.dumps(raw))
    with pytest.raises(SchemaError, match=r"enum event_type has symbols .*'bookmark'.*change both together"):
        load_schema(bad)


def test_event_datetime_is_timezone_aware_utc() -> None:
    event = {"event_time": 1_767_225_600_123}
    assert event_datetime(event) == datetime(2026, 1, 1, 0, 0, 0, 123_000, tzinfo=UTC)  # type: ignore[arg-type]
