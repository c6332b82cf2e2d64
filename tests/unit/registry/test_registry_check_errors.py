"""Each check error on a small broken repo: code, file, line, view/feature and message content."""

from __future__ import annotations

import pytest

from headwater.registry.diagnostics import Diagnostic, Severity
from headwater.registry.testing import MINIMAL_VIEW as VIEW
from headwater.registry.testing import ScratchRepo as Repo
from headwater.registry.testing import line_of


def only(result_diags: list[Diagnostic], code: str) -> Diagnostic:
    hits = [d for d in result_diags if d.code == code]
    assert len(hits) == 1, [d.format() for d in result_diags]
    return hits[0]


def test_clean_view_has_no_findings(repo: Repo) -> None:
    repo.write("v1.yaml", VIEW)
    result = repo.check()
    assert result.diagnostics.items == []
    assert [v.name for v in result.views] == ["v1"]


@pytest.mark.usefixtures("yaml_backend")
def test_bad_yaml_names_file_and_line(repo: Repo) -> None:
    text = VIEW.replace("owner: team-a", "owner: [team-a")
    repo.write("v1.yaml", text)
    diag = only(repo.check().diagnostics.items, "bad-yaml")
    assert diag.file == "features/v1.yaml"
    assert diag.line >= line_of(text, "owner:")
    assert "not valid YAML" in diag.message


@pytest.mark.usefixtures("yaml_backend")
def test_duplicate_yaml_key_is_bad_yaml(repo: Repo) -> None:
    text = VIEW.replace("owner: team-a", "owner: team-a\nowner: team-b")
    repo.write("v1.yaml", text)
    diag = only(repo.check().diagnostics.items, "bad-yaml")
    assert diag.line == line_of(text, "owner: team-b")
    assert "duplicate key 'owner'" in diag.message


@pytest.mark.usefixtures("yaml_backend")
def test_unknown_key_suggests_the_right_one(repo: Repo) -> None:
    text = VIEW.replace("    window: 30s", "    windw: 30s")
    repo.write("v1.yaml", text)
    diags = repo.check().diagnostics.items
    diag = only(diags, "unknown-key")
    assert (diag.file, diag.line) == ("features/v1.yaml", line_of(text, "windw"))
    assert (diag.view, diag.feature) == ("v1", "clicks_30s")
    assert diag.found == "windw"
    assert diag.hint == "did you mean 'window'?"
    assert "window" in (diag.expected or "")
    assert only(diags, "missing-key").message == "missing required key 'window'"


def test_unknown_top_level_key(repo: Repo) -> None:
    text = VIEW.replace("owner: team-a", "owner: team-a\nownr: team-b")
    repo.write("v1.yaml", text)
    diag = only(repo.check().diagnostics.items, "unknown-key")
    assert diag.line == line_of(text, "ownr")
    assert diag.hint == "did you mean 'owner'?"


@pytest.mark.parametrize(
    ("written", "hint_part"),
    [("30 sec", "expected a duration"), ("P1M", "months and years"), ("0s", "zero")],
)
def test_bad_duration(repo: Repo, written: str, hint_part: str) -> None:
    text = VIEW.replace("window: 30s", f"window: {written}")
    repo.write("v1.yaml", text)
    diag = only(repo.check().diagnostics.items, "bad-duration")
    assert diag.line == line_of(text, "window:")
    assert diag.feature == "clicks_30s"
    assert repr(written) in (diag.found or "")
    assert hint_part in (diag.hint or "")


def test_bare_number_is_not_a_duration(repo: Repo) -> None:
    repo.write("v1.yaml", VIEW.replace("freshness_sla: PT10S", "freshness_sla: 5"))
    diag = only(repo.check().diagnostics.items, "bad-duration")
    assert "no unit" in (diag.hint or "")


def test_unknown_entity_and_source_in_one_run(repo: Repo) -> None:
    text = VIEW.replace("entity: user", "entity: usr").replace("source: events", "source: clicks")
    repo.write("v1.yaml", text)
    diags = repo.check().diagnostics.items
    entity = only(diags, "unknown-entity")
    assert entity.line == line_of(text, "entity:")
    assert entity.hint == "did you mean 'user'?"
    assert entity.expected == "one of: user, item, account, merchant"
    source = only(diags, "unknown-source")
    assert source.line == line_of(text, "source:")
    assert source.found == "clicks"


def test_unknown_event_field_in_field_and_where(repo: Repo) -> None:
    text = (
        VIEW
        + """\
  - name: dwell_avg
    agg: avg
    field: dwel_ms
    window: 1m
  - name: bad_filter
    agg: count
    where: "evnt_type = 'click'"
    window: 1m
"""
    )
    repo.write("v1.yaml", text)
    diags = repo.check().diagnostics.items
    field = only(diags, "unknown-field")
    assert (field.line, field.feature) == (line_of(text, "dwel_ms"), "dwell_avg")
    assert field.hint == "did you mean 'dwell_ms'?"
    where = only(diags, "bad-where")
    assert (where.line, where.feature) == (line_of(text, "evnt_type"), "bad_filter")
    assert "unknown event field 'evnt_type'" in where.message
    assert where.hint == "did you mean 'event_type'?"


def test_where_enum_typo_and_syntax_error(repo: Repo) -> None:
    text = (
        VIEW.replace("event_type = 'click'", "event_type = 'clik'")
        + """\
  - name: broken
    agg: count
    where: "event_type = 'click' and"
    window: 1m
"""
    )
    repo.write("v1.yaml", text)
    diags = [d for d in repo.check().diagnostics.items if d.code == "bad-where"]
    assert len(diags) == 2
    typo, syntax = sorted(diags, key=lambda d: d.line)
    assert "'clik' is not a value of enum field 'event_type'" in typo.message
    assert typo.hint == "did you mean 'click'?"
    assert "found the end of the filter" in syntax.message
    assert syntax.line == line_of(text, "'click' and")


def test_duplicate_view_names_across_files(repo: Repo) -> None:
    repo.write("a.yaml", VIEW)
    repo.write("b.yaml", VIEW)
    diag = only(repo.check().diagnostics.items, "duplicate-name")
    assert diag.file == "features/b.yaml"
    assert diag.line == 1
    assert diag.found == "another definition at features/a.yaml:1"


def test_duplicate_feature_names(repo: Repo) -> None:
    text = VIEW + "  - name: clicks_30s\n    agg: count\n    window: 1m\n"
    repo.write("v1.yaml", text)
    diag = only(repo.check().diagnostics.items, "duplicate-name")
    assert diag.line == line_of(text, "name: clicks_30s", occurrence=2)
    assert diag.found == f"also on line {line_of(text, 'name: clicks_30s')}"


@pytest.mark.parametrize(("agg", "field"), [("sum", "category"), ("avg", "event_type"), ("top_k", "price")])
def test_aggregation_that_does_not_fit_the_field(repo: Repo, agg: str, field: str) -> None:
    text = VIEW + f"  - name: f2\n    agg: {agg}\n    field: {field}\n    k: 3\n    window: 1m\n"
    if agg != "top_k":
        text = text.replace("    k: 3\n", "")
    repo.write("v1.yaml", text)
    diag = only(repo.check().diagnostics.items, "agg-type")
    assert diag.line == line_of(text, f"field: {field}")
    assert diag.message.startswith(f"{agg} does not fit field '{field}'")
    assert diag.feature == "f2"


def test_agg_parameter_rules(repo: Repo) -> None:
    text = (
        VIEW
        + """\
  - name: top_no_k
    agg: top_k
    field: category
    window: 1m
  - name: ratio_half
    agg: ratio
    window: 1m
    numerator: {agg: count, where: "event_type = 'click'"}
  - name: sum_no_field
    agg: sum
    window: 1m
"""
    )
    repo.write("v1.yaml", text)
    messages = {(d.feature, d.message) for d in repo.check().diagnostics.items}
    assert ("top_no_k", "top_k needs `k`") in messages
    assert ("ratio_half", "ratio needs a `denominator`") in messages
    assert ("sum_no_field", "sum needs a `field`") in messages


def test_declared_dtype_must_hold_inferred(repo: Repo) -> None:
    text = VIEW.replace("    window: 30s", "    window: 30s\n    dtype: string")
    repo.write("v1.yaml", text)
    diag = only(repo.check().diagnostics.items, "bad-dtype")
    assert (diag.expected, diag.found) == ("int64", "string")


def test_window_longer_than_tier_keeps(repo: Repo) -> None:
    text = VIEW.replace("window: 30s", "window: 2h")
    repo.write("v1.yaml", text)
    diag = only(repo.check().diagnostics.items, "window-too-long")
    assert diag.line == line_of(text, "window: 2h")
    assert diag.expected == "at most 1h on realtime"
    assert "nearline or offline" in (diag.hint or "")


def test_sla_tighter_than_tier_floor_is_an_error(repo: Repo) -> None:
    text = VIEW.replace("tier: realtime", "tier: nearline").replace("PT10S", "PT30S")
    repo.write("v1.yaml", text)
    result = repo.check()
    diag = only(result.diagnostics.items, "sla-too-tight")
    assert diag.severity is Severity.ERROR
    assert diag.line == line_of(text, "freshness_sla")
    assert diag.expected == "at least 3m on nearline"
    assert diag.found == "PT30S"
    assert "move the view to tier realtime" in (diag.hint or "")
    assert not result.ok


def test_realtime_sla_below_the_measured_floor_is_an_error(repo: Repo) -> None:
    # The realtime floor is 5 s: a 1 s slide + the job's measured delay, with room for load.
    text = VIEW.replace("PT10S", "PT2S")
    repo.write("v1.yaml", text)
    diag = only(repo.check().diagnostics.items, "sla-too-tight")
    assert (diag.expected, diag.found) == ("at least 5s on realtime", "PT2S")
    assert diag.line == line_of(text, "freshness_sla")


def test_sla_a_cheaper_tier_could_meet_is_a_warning(repo: Repo) -> None:
    text = VIEW.replace("PT10S", "PT10M")
    repo.write("v1.yaml", text)
    result = repo.check()
    diag = only(result.diagnostics.items, "cheaper-tier")
    assert diag.severity is Severity.WARNING
    assert "cheaper nearline tier" in diag.message
    assert "tier: nearline" in (diag.hint or "")
    assert result.ok


def test_slide_longer_than_sla(repo: Repo) -> None:
    text = (
        VIEW.replace("window: 30s", "window: 1h\n    slide: 10m")
        .replace("PT10S", "PT5M")
        .replace("tier: realtime", "tier: nearline")
    )
    repo.write("v1.yaml", text)
    diag = only(repo.check().diagnostics.items, "sla-too-tight")
    assert diag.line == line_of(text, "slide: 10m")
    assert "slide 10m updates values less often" in diag.message


def test_missing_key_and_bad_type(repo: Repo) -> None:
    text = VIEW.replace("owner: team-a\n", "").replace("compute_cost: 10", 'compute_cost: "cheap"')
    repo.write("v1.yaml", text)
    diags = repo.check().diagnostics.items
    assert only(diags, "missing-key").message == "missing required key 'owner'"
    bad = only(diags, "bad-value")
    assert bad.line == line_of(text, "compute_cost")
    assert bad.found == "'cheap' (str)"


def test_all_errors_reported_in_one_run(repo: Repo) -> None:
    repo.write("a.yaml", VIEW.replace("entity: user", "entity: usr").replace("window: 30s", "window: 2h"))
    repo.write("b.yaml", VIEW.replace("v1", "v2").replace("agg: count", "agg: cnt"))
    repo.write("c.yaml", "feature_view: [oops\n")
    result = repo.check()
    found = sorted((d.file, d.code) for d in result.diagnostics.errors)
    assert found == [
        ("features/a.yaml", "unknown-entity"),
        ("features/a.yaml", "window-too-long"),
        ("features/b.yaml", "bad-value"),
        ("features/c.yaml", "bad-yaml"),
    ]


def test_entities_file_errors_keep_the_good_entries(repo: Repo) -> None:
    text = (
        "entities:\n  - name: user\n    join_key: user_id\n"
        "  - name: item\n    join_key: item_id\n    colour: red\n"
    )
    repo.write("entities.yaml", text)
    repo.write("v1.yaml", VIEW)
    diags = repo.check().diagnostics.items
    diag = only(diags, "unknown-key")
    assert (diag.file, diag.line) == ("features/entities.yaml", line_of(text, "colour"))
    assert [d.code for d in diags] == ["unknown-key"]


def test_missing_budget_file(repo: Repo) -> None:
    (repo.root / "budget.yaml").unlink()
    repo.write("v1.yaml", VIEW)
    diag = only(repo.check().diagnostics.items, "missing-file")
    assert diag.file == "features/budget.yaml"


def test_bad_schema_path(repo: Repo) -> None:
    text = (
        (repo.root / "sources.yaml").read_text().replace("schemas/behavior_event.avsc", "schemas/nope.avsc")
    )
    repo.write("sources.yaml", text)
    diag = only(repo.check().diagnostics.items, "bad-schema")
    assert diag.line == line_of(text, "schema:")
    assert "cannot read Avro schema" in diag.message
