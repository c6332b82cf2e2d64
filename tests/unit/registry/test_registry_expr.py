"""The `where` language: parser, type checks, three-valued evaluator, SQL back ends, JSON."""

from __future__ import annotations

from pathlib import Path

import pytest

from headwater.registry.avro import load_event_schema
from headwater.registry.expr import (
    And,
    Compare,
    ExprError,
    InList,
    IsNull,
    Not,
    Or,
    from_json,
    parse,
    to_json,
)
from headwater.registry.expr_check import check_expr
from headwater.registry.expr_eval import compile_predicate, evaluate, matches
from headwater.registry.expr_sql import to_sql


def test_precedence_and_binds_tighter_than_or() -> None:
    expr = parse("event_type = 'click' or event_type = 'like' and price > 10")
    assert expr == Or(
        (
            Compare("event_type", "=", "click"),
            And((Compare("event_type", "=", "like"), Compare("price", ">", 10))),
        )
    )


def test_parentheses_not_in_and_null_tests() -> None:
    expr = parse("NOT (device in ('ios', \"web\")) AND item_id IS NOT NULL and position not in (1, 2.5)")
    assert expr == And(
        (
            Not(InList("device", ("ios", "web"))),
            IsNull("item_id", negated=True),
            InList("position", (1, 2.5), negated=True),
        )
    )


def test_operator_aliases_and_escaped_quotes() -> None:
    assert parse("query == 'it''s'") == Compare("query", "=", "it's")
    assert parse("query <> 'a'") == Compare("query", "!=", "a")


@pytest.mark.parametrize(
    ("text", "pos", "fragment"),
    [
        ("event_type = ", 13, "found the end of the filter"),
        ("event_type = 'click' and", 24, "found the end of the filter"),
        ("'click' = event_type", 0, "must start with a field name"),
        ("event_type = click", 13, "found name 'click'"),
        ("price > 10 price", 11, "after a complete condition"),
        ("(price > 10", 11, "')' to close"),
        ("price ; 1", 6, "unexpected character ';'"),
        ("query = 'open", 8, "unexpected character"),
        ("price = null", 8, "never true"),
        ("", 0, "empty"),
    ],
)
def test_parse_errors_carry_position(text: str, pos: int, fragment: str) -> None:
    with pytest.raises(ExprError) as info:
        parse(text)
    assert info.value.pos == pos
    assert fragment in str(info.value)


def test_no_eval_of_python() -> None:
    with pytest.raises(ExprError):
        parse("__import__('os').system('true')")


@pytest.fixture(scope="module")
def schema():  # type: ignore[no-untyped-def]
    return load_event_schema(Path(__file__).resolve().parents[3] / "features/schemas/behavior_event.avsc")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("event_type = 'clik'", "'clik' is not a value of enum field 'event_type'"),
        ("price > '10'", "numeric field 'price'"),
        ("query = 5", "string field 'query' compared with 5"),
        ("event_type > 'click'", "'>' does not order enum field"),
        ("user_id is null", "never null"),
        ("colour = 'red'", "unknown event field 'colour'"),
    ],
)
def test_type_errors(schema, text: str, fragment: str) -> None:  # type: ignore[no-untyped-def]
    problems = check_expr(parse(text), schema)
    assert len(problems) == 1
    assert fragment in str(problems[0])


def test_well_typed_filter_has_no_problems(schema) -> None:  # type: ignore[no-untyped-def]
    expr = parse(
        "event_type in ('click', 'like') and price >= 1.5 and dwell_ms > 100 and category is not null"
    )
    assert check_expr(expr, schema) == []


def test_three_valued_logic_matches_sql() -> None:
    gt = parse("price > 10")
    assert evaluate(gt, {"price": 20}) is True
    assert evaluate(gt, {"price": 5}) is False
    assert evaluate(gt, {"price": None}) is None
    assert evaluate(parse("not (price > 10)"), {}) is None
    assert matches(parse("not (price > 10)"), {}) is False
    assert evaluate(parse("price > 10 or event_type = 'click'"), {"event_type": "click"}) is True
    assert evaluate(parse("price > 10 and event_type = 'click'"), {"event_type": "view"}) is False
    assert evaluate(parse("price > 10 and event_type = 'click'"), {"event_type": "click"}) is None
    assert evaluate(parse("item_id is null"), {}) is True


def test_compiled_predicate_filters_events() -> None:
    keep = compile_predicate(parse("event_type in ('click', 'like') and not position > 3"))
    events = [
        {"event_type": "click", "position": 1},
        {"event_type": "like", "position": 7},
        {"event_type": "impression", "position": 1},
        {"event_type": "click", "position": None},
    ]
    assert [keep(e) for e in events] == [True, False, False, False]
    assert compile_predicate(None)({}) is True


def test_sql_back_ends() -> None:
    expr = parse("event_type = 'click' and (position <= 3 or query != 'it''s \\\\x') and item_id is not null")
    assert to_sql(expr, "flink") == (
        "`event_type` = 'click' AND (`position` <= 3 OR `query` <> 'it''s \\x') AND `item_id` IS NOT NULL"
    )
    assert to_sql(expr, "spark") == (
        "`event_type` = 'click' AND (`position` <= 3 OR `query` <> 'it\\'s \\\\x') AND `item_id` IS NOT NULL"
    )
    assert to_sql(parse("not device in ('ios')"), "spark") == "NOT (`device` IN ('ios'))"
    with pytest.raises(ValueError, match="unknown SQL dialect"):
        to_sql(expr, "mysql")


def test_json_round_trip() -> None:
    expr = parse("not (event_type in ('click') or price >= 2.5) and query is null and device not in ('web')")
    data = to_json(expr)
    assert data["op"] == "and"
    assert from_json(data) == expr
