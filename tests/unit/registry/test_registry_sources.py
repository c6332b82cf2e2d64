"""Sources as data: schema shapes, keys, rules, evolution and the resolved event-time rules in the plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headwater.registry.apply import ApplyError, apply_repo
from headwater.registry.diagnostics import Diagnostic
from headwater.registry.plans import plan_source
from headwater.registry.sources import (
    DEFAULT_ALLOWED_LATENESS_S,
    DEFAULT_MAX_FUTURE_S,
    DEFAULT_MAX_OUT_OF_ORDERNESS_S,
    LANDING_COLUMNS,
)
from headwater.registry.testing import MINIMAL_VIEW as MINIMAL_REALTIME
from headwater.registry.testing import ScratchRepo as Repo
from headwater.registry.testing import line_of
from headwater.registry.tiers import TIERS

PAYMENTS = "schemas/payment_event.avsc"


def only(diags: list[Diagnostic], code: str) -> Diagnostic:
    hits = [d for d in diags if d.code == code]
    assert len(hits) == 1, [d.format() for d in diags]
    return hits[0]


def _schema(repo: Repo, rel: str = PAYMENTS) -> dict[str, object]:
    return dict(json.loads((repo.root / rel).read_text()))


def _write_schema(repo: Repo, schema: dict[str, object], rel: str = PAYMENTS) -> str:
    text = json.dumps(schema, indent=2)
    repo.write(rel, text)
    return text


def _sources(repo: Repo) -> str:
    return (repo.root / "sources.yaml").read_text()


def test_example_sources_resolve_into_the_plan(repo: Repo) -> None:
    result = repo.check()
    assert result.ok, [d.format() for d in result.diagnostics.items]
    events = plan_source(result.sources["events"])
    payments = plan_source(result.sources["payments"])
    assert (events.key, events.event_id, events.event_time, events.event_time_unit) == (
        "user_id",
        "event_id",
        "event_time",
        "ms",
    )
    assert (payments.key, payments.event_id, payments.event_time, payments.event_time_unit) == (
        "account_id",
        "payment_id",
        "occurred_at",
        "us",
    )
    assert (payments.max_out_of_orderness_ms, payments.allowed_lateness_ms) == (2_000, 30_000)
    assert payments.max_future_ms == round(DEFAULT_MAX_FUTURE_S * 1000)
    assert payments.min_event_time_ms == 946_684_800_000
    assert [f.name for f in payments.fields][:3] == ["payment_id", "account_id", "merchant_id"]
    assert payments.field("method") is not None
    assert payments.field("method").symbols == ["card", "wallet", "bank_transfer"]  # type: ignore[union-attr]
    assert payments.rules[0].text == "amount >= 0"
    assert payments.rules[0].sql["flink"] == "`amount` >= 0"
    assert len(payments.schemas) == 1
    assert len(payments.current.fingerprint) == 16


def test_unset_event_time_rules_take_the_registry_defaults(repo: Repo) -> None:
    text = _sources(repo)
    for line in ("    max_out_of_orderness: 2s\n", "    allowed_lateness: 30s\n"):
        text = text.replace(line, "")
    text = text.replace(
        "    event_id: payment_id\n", "    event_id: payment_id\n    min_event_time: 1990-01-01\n"
    )
    repo.write("sources.yaml", text)
    result = repo.check()
    assert result.ok, [d.format() for d in result.diagnostics.items]
    payments = plan_source(result.sources["payments"])
    assert payments.max_out_of_orderness_ms == round(DEFAULT_MAX_OUT_OF_ORDERNESS_S * 1000)
    assert payments.allowed_lateness_ms == round(DEFAULT_ALLOWED_LATENESS_S * 1000)
    assert payments.min_event_time_ms == 631_152_000_000  # 1990-01-01T00:00:00Z


@pytest.mark.parametrize(
    ("avro_type", "shown"),
    [
        ({"type": "array", "items": "string"}, "array"),
        ("bytes", "bytes"),
        ({"type": "record", "name": "Inner", "fields": []}, "record"),
        (["null", "string", "long"], "union"),
        ({"type": "int", "logicalType": "date"}, "date"),
    ],
)
def test_unsupported_avro_field_names_avsc_file_line_and_field(
    repo: Repo, avro_type: object, shown: str
) -> None:
    schema = _schema(repo)
    fields = list(schema["fields"])  # type: ignore[call-overload]
    fields.insert(3, {"name": "tags", "type": avro_type})
    schema["fields"] = fields
    text = _write_schema(repo, schema)
    diag = only(repo.check().diagnostics.items, "bad-schema")
    assert diag.file == f"features/{PAYMENTS}"
    assert diag.line == line_of(text, '"name": "tags"')
    assert "field 'tags'" in diag.message
    assert shown in diag.message


def test_key_must_be_a_field_of_the_schema(repo: Repo) -> None:
    text = _sources(repo).replace("key: account_id", "key: acount_id")
    repo.write("sources.yaml", text)
    diag = only(repo.check().diagnostics.items, "unknown-field")
    assert diag.file == "features/sources.yaml"
    assert diag.line == line_of(text, "key: acount_id")
    assert diag.found == "no such field"
    assert "account_id" in (diag.hint or "")


def test_event_id_must_not_be_nullable(repo: Repo) -> None:
    text = _sources(repo).replace("event_id: payment_id", "event_id: risk_score")
    repo.write("sources.yaml", text)
    diag = only(repo.check().diagnostics.items, "unknown-field")
    assert diag.line == line_of(text, "event_id: risk_score")
    assert diag.found == "double|null"


def test_bad_rule_points_at_its_line_and_column(repo: Repo) -> None:
    text = _sources(repo).replace('- "amount >= 0"', "- \"amount >= 'x'\"")
    repo.write("sources.yaml", text)
    diag = only(repo.check().diagnostics.items, "bad-rule")
    assert diag.line == line_of(text, "amount >= 'x'")
    assert "source 'payments'" in diag.message


def test_compatible_evolution_keeps_every_version_in_the_plan(repo: Repo) -> None:
    old = _schema(repo)
    repo.write("schemas/payment_event.v1.avsc", json.dumps(old, indent=2))
    new = dict(old)
    new["fields"] = [*old["fields"], {"name": "channel", "type": ["null", "string"], "default": None}]  # type: ignore[misc]
    _write_schema(repo, new)
    text = _sources(repo).replace(
        "    schema: schemas/payment_event.avsc\n",
        "    schema: schemas/payment_event.avsc\n    previous_schemas: [schemas/payment_event.v1.avsc]\n",
    )
    repo.write("sources.yaml", text)
    result = repo.check()
    assert result.ok, [d.format() for d in result.diagnostics.items]
    payments = plan_source(result.sources["payments"])
    assert len(payments.schemas) == 2
    assert payments.schemas[0].fingerprint != payments.current.fingerprint
    assert [f.name for f in payments.fields][-1] == "channel"


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda f: [*f, {"name": "channel", "type": "string"}], "added without a default"),
        (lambda f: [dict(x, type="long") if x["name"] == "amount" else x for x in f], "cannot promote"),
        (
            lambda f: [
                {"name": "risk_score", "type": "double"} if x["name"] == "risk_score" else x for x in f
            ],
            "now required",
        ),
    ],
)
def test_incompatible_evolution_names_the_field_and_the_fix(repo: Repo, change: object, problem: str) -> None:
    old = _schema(repo)
    repo.write("schemas/payment_event.v1.avsc", json.dumps(old, indent=2))
    new = dict(old)
    new["fields"] = change(old["fields"])  # type: ignore[operator]
    text = _write_schema(repo, new)
    repo.write(
        "sources.yaml",
        _sources(repo).replace(
            "    schema: schemas/payment_event.avsc\n",
            "    schema: schemas/payment_event.avsc\n    previous_schemas: [schemas/payment_event.v1.avsc]\n",
        ),
    )
    diag = only(repo.check().diagnostics.items, "incompatible-schema")
    assert diag.file == f"features/{PAYMENTS}"
    field = diag.message.split("field '")[1].split("'")[0]
    assert diag.line == line_of(text, f'"name": "{field}"')
    assert problem in diag.message
    assert diag.hint


def test_apply_refuses_to_drop_an_applied_schema_version(repo: Repo, tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = repo.check()
    apply_repo(first, state, "127.0.0.1:1")
    schema = _schema(repo)
    schema["fields"] = [*schema["fields"], {"name": "channel", "type": ["null", "string"], "default": None}]  # type: ignore[misc]
    _write_schema(repo, schema)
    second = repo.check()
    assert second.ok
    with pytest.raises(ApplyError, match=r"would drop schema version .*previous_schemas"):
        apply_repo(second, state, "127.0.0.1:1")


OFFLINE_RATIO = """\
feature_view: v1
entity: user
source: events
tier: offline
freshness_sla: P1D
compute_cost: 5
owner: team-a
description: a ratio over a distinct count
features:
  - name: clicks_per_item_7d
    agg: ratio
    window: 7d
    numerator: {agg: count, where: "event_type = 'click'"}
    denominator: {agg: distinct_count, field: item_id}
"""


def test_every_tier_divides_a_distinct_count(repo: Repo) -> None:
    repo.write("v1.yaml", OFFLINE_RATIO)
    assert [d.format() for d in repo.check().diagnostics.errors] == []
    assert all("distinct_count" in tier.ratio_operands for tier in TIERS.values())


def test_realtime_views_publish_at_one_slide(repo: Repo) -> None:
    text = MINIMAL_REALTIME + "  - name: clicks_5m\n    agg: count\n    window: 5m\n    slide: 5s\n"
    repo.write("v1.yaml", text)
    diag = only(repo.check().diagnostics.items, "tier-cannot-run")
    assert diag.line == line_of(text, "features:")
    assert "clicks_5m: 5s" in (diag.found or "")


def test_event_time_and_event_id_are_reserved_names(repo: Repo) -> None:
    schema = _schema(repo)
    schema["fields"] = [*schema["fields"], {"name": "event_id", "type": ["null", "string"], "default": None}]  # type: ignore[misc]
    _write_schema(repo, schema)
    text = _sources(repo)
    diag = only(repo.check().diagnostics.items, "reserved-field")
    assert diag.line == line_of(text, "event_id: payment_id")
    assert "source 'payments'" in diag.message


@pytest.mark.parametrize("name", LANDING_COLUMNS)
def test_landing_column_names_are_reserved(repo: Repo, name: str) -> None:
    schema = _schema(repo)
    schema["fields"] = [*schema["fields"], {"name": name, "type": ["null", "string"], "default": None}]  # type: ignore[misc]
    _write_schema(repo, schema)
    diag = only(repo.check().diagnostics.items, "reserved-field")
    assert diag.found == name
    assert diag.line == line_of(_sources(repo), "schema: schemas/payment_event.avsc")


def test_landing_columns_are_the_offline_tiers() -> None:
    from headwater.pipelines.offline.source_columns import RESERVED

    assert set(LANDING_COLUMNS) == RESERVED
