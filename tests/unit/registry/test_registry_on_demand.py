"""``tier: on_demand`` views: the expression language, the checks (file, line, view, feature), the plan.

A scratch repo holds four example views (user and item, numbers, ids and a top_k) and one on-demand
view per test. Property-based tests throw token soups at the expression parser and random trees at
the YAML keys: every one ends in a diagnostic (or a value), never a traceback.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.cli.registry import check
from headwater.registry.expr import ExprError
from headwater.registry.expr_value import (
    NUMBER,
    SlotType,
    check_value,
    evaluate,
    from_json,
    parse_value,
    refs_of,
    request_columns,
    to_json,
)
from headwater.registry.plans import build_plans, registry_hash
from headwater.registry.report import check_json, check_text
from headwater.registry.testing import ScratchRepo, line_of
from headwater.registry.validate import check_repo

EXAMPLE = Path(__file__).resolve().parents[3] / "features"
VIEWS = (
    "user_purchase_offline.yaml",
    "item_conversion_offline.yaml",
    "user_category_affinity_nearline.yaml",
    "user_dwell_realtime.yaml",
    "user_session_realtime.yaml",
)
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

GOOD = """\
feature_view: pair_features
tier: on_demand
inputs:
  - item_conversion_offline.item_price_max_30d
  - user_purchase_offline.avg_order_value_30d
  - user_category_affinity_nearline.favourite_categories_24h
  - user_session_realtime.category_share_5m
owner: feed-ranking
description: test
features:
  - name: price_vs_usual
    expression: "item_conversion_offline.item_price_max_30d / user_purchase_offline.avg_order_value_30d"
  - name: focus
    expression: >-
      share_of(user_category_affinity_nearline.favourite_categories_24h,
      user_session_realtime.category_share_5m.top1)
  - name: doubled
    expression: "pair_features.price_vs_usual * 2 + request.hour_of_day"
"""


def _scratch(root: Path) -> ScratchRepo:
    repo = ScratchRepo(root, template=EXAMPLE)
    for name in VIEWS:
        shutil.copy(EXAMPLE / name, root / name)
    return repo


@pytest.fixture
def repo(tmp_path: Path) -> ScratchRepo:
    return _scratch(tmp_path / "features")


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> ScratchRepo:
    """One repo for all examples of a property (hypothesis re-runs the body, not the fixture)."""
    return _scratch(tmp_path_factory.mktemp("od") / "features")


def run(text: str, columns: dict[str, object] | None = None, n: int = 3) -> np.ndarray:
    return evaluate(parse_value(text), columns or {}, n)


# --- the language ---------------------------------------------------------------------------------


def test_precedence_unary_minus_and_parentheses() -> None:
    assert run("1 + 2 * 3").tolist() == [7.0] * 3
    assert run("(1 + 2) * 3").tolist() == [9.0] * 3
    assert run("-2 * -3 - 1").tolist() == [5.0] * 3
    assert run("8 / 4 / 2").tolist() == [1.0] * 3  # left associative


def test_safe_division_and_missing_values() -> None:
    cols = {"a.x": np.array([6.0, 1.0, np.nan]), "b.y": np.array([3.0, 0.0, 2.0])}
    out = run("a.x / b.y", cols)
    assert out[0] == 2.0
    assert math.isnan(out[1])  # divisor 0: missing, never inf
    assert math.isnan(out[2])  # a missing input propagates
    assert run("coalesce(a.x / b.y, -1)", cols).tolist() == [2.0, -1.0, -1.0]


def test_functions() -> None:
    cols = {"a.x": np.array([-3.0, 0.5, np.nan]), "b.y": 2.0}  # a float: one user's slot, broadcast
    assert run("abs(a.x)", cols)[:2].tolist() == [3.0, 0.5]
    assert run("min(a.x, b.y)", cols)[:2].tolist() == [-3.0, 0.5]
    assert run("max(a.x, b.y)", cols)[:2].tolist() == [2.0, 2.0]
    assert math.isnan(run("log1p(a.x)", cols)[0])  # ln of a negative: missing
    assert run("log1p(a.x)", cols)[1] == pytest.approx(math.log1p(0.5))
    same = run("same(a.x, -3)", cols)
    assert same[:2].tolist() == [1.0, 0.0]
    assert math.isnan(same[2])


def test_share_of_sums_the_shares_of_matching_ids() -> None:
    cols = {
        "u.fav.top1": np.array([5.0, 7.0, np.nan]),
        "u.fav.top2": np.array([7.0, 5.0, np.nan]),
        "u.fav.share1": np.array([0.6, 0.9, 0.0]),
        "u.fav.share2": np.array([0.4, 0.1, 0.0]),
        "i.cat": np.array([7.0, 7.0, 7.0]),
    }
    assert run("share_of(u.fav, i.cat)", cols).tolist() == [0.4, 0.9, 0.0]


def test_request_columns_are_utc_time_hour_and_weekday() -> None:
    cols = request_columns(np.array([0, 1_767_245_400_000]))  # 1970-01-01 (Thu), 2026-01-01 05:30 (Thu)
    assert cols["request.time"].tolist() == [0.0, 1_767_245_400.0]
    assert cols["request.hour_of_day"].tolist() == [0.0, 5.0]
    assert cols["request.day_of_week"].tolist() == [3.0, 3.0]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "empty"),
        ("1 +", "position 4"),
        ("a.x ** 2", "position 6"),
        ("foo(a.x)", "unknown function 'foo'"),
        ("min(a.x)", "min takes 2 argument(s), found 1"),
        ("x + 1", "'x' at position 1 is neither a reference"),
        ("(a.x", "')'"),
        ("a.x 'b'", "unexpected character"),
        ("-" * 40 + "1", "nests deeper"),
    ],
)
def test_parse_errors_say_where(text: str, needle: str) -> None:
    with pytest.raises(ExprError, match=None) as info:
        parse_value(text)
    assert needle in str(info.value)


def test_type_errors() -> None:
    types = {
        "u.n": SlotType(NUMBER),
        "u.last_item": SlotType("id", "item_id"),
        "u.fav": SlotType("top_k", "category"),
        "u.fav.top1": SlotType("id", "category"),
    }

    def errs(text: str) -> list[str]:
        return [str(e) for e in check_value(parse_value(text), lambda ref: types.get(ref.name))[1]]

    assert errs("u.n * 2 + share_of(u.fav, u.fav.top1) + same(u.last_item, u.last_item)") == []
    assert "needs numbers; u.last_item is an id of field 'item_id'" in errs("u.last_item + 1")[0]
    assert "only share_of() reads it" in errs("u.fav * 2")[0]
    assert (
        "looks up a value of field 'category'; found an id of field 'item_id'"
        in errs("share_of(u.fav, u.last_item)")[0]
    )
    assert "same() compares an id of field 'item_id' with a number" in errs("same(u.last_item, u.n)")[0]


def test_json_round_trip() -> None:
    ast = parse_value("coalesce(-a.x / (b.y + 2), share_of(u.fav, i.c)) * request.time")
    assert from_json(to_json(ast)) == ast
    assert [r.name for r in refs_of(ast)] == ["a.x", "b.y", "u.fav", "i.c", "request.time"]


# --- the checks -----------------------------------------------------------------------------------


def test_a_good_view_compiles_into_every_plan_and_check_output(repo: ScratchRepo) -> None:
    repo.write("pair_features.yaml", GOOD)
    result = repo.check()
    assert result.ok, [d.format() for d in result.diagnostics.errors]
    [od] = result.on_demand
    assert [f.name for f in od.features] == ["price_vs_usual", "focus", "doubled"]
    plans = build_plans(result, registry_hash(result))
    for plan in plans.values():
        assert [v.name for v in plan.on_demand] == ["pair_features"]
        assert plan.on_demand[0].features[0].ast["op"] == "/"
    assert all(od.name not in [v.name for v in p.views] for p in plans.values())  # on no streaming tier
    assert "on_demand pair_features: 3 feature(s), 0 CPU-h/day on every tier" in check_text(result)
    assert check_json(result)["on_demand"][0]["cpu_hours_per_day"] == 0.0


def test_the_example_repo_plans_its_on_demand_view() -> None:
    result = check_repo(EXAMPLE)
    assert result.ok
    plan = build_plans(result, registry_hash(result))["offline"]
    [view] = plan.on_demand
    assert view.name == "user_item_on_demand"
    assert view.ops > 0
    assert view.version.startswith("v")


def test_errors_name_file_line_view_and_feature(repo: ScratchRepo) -> None:
    text = """\
feature_view: bad
tier: on_demand
inputs:
  - user_purchase_offline.avg_order_valu_30d
  - user_dwell_realtime.last_clicked_item_5m
  - item_conversion_offline.item_price_max_30d
owner: t
description: t
features:
  - name: not_declared
    expression: "item_conversion_offline.item_revenue_30d + 1"
  - name: id_math
    expression: "user_dwell_realtime.last_clicked_item_5m * 2"
  - name: when
    expression: "request.week"
  - name: item_price_max_30d
    expression: "1"
  - name: broken
    expression: "1 +"
"""
    repo.write("bad.yaml", text)
    errors = {(d.code, d.feature): d for d in repo.check().diagnostics.errors}
    unknown = errors["unknown-input", None]
    assert (unknown.file, unknown.line, unknown.view) == ("features/bad.yaml", 4, "bad")
    assert unknown.hint == "did you mean 'user_purchase_offline.avg_order_value_30d'?"
    assert errors["bad-expression", "not_declared"].line == line_of(text, "item_revenue_30d")
    assert (
        errors["bad-expression", "not_declared"].hint
        == "add 'item_conversion_offline.item_revenue_30d' to `inputs`"
    )
    assert "is an id of field 'item_id'" in errors["bad-expression", "id_math"].message
    assert "unknown request field 'week'" in errors["bad-expression", "when"].message
    assert errors["duplicate-name", "item_price_max_30d"].line == line_of(text, "name: item_price_max_30d")
    assert errors["bad-expression", "broken"].line == line_of(text, '"1 +"')


def test_a_cycle_across_views_is_reported_on_each_member(repo: ScratchRepo) -> None:
    first = """\
feature_view: od_a
tier: on_demand
inputs: [od_b.y]
owner: t
description: t
features:
  - name: x
    expression: "od_b.y + 1"
"""
    second = first.replace("od_a", "od_b").replace("od_b.y", "od_a.x").replace("name: x", "name: y")
    repo.write("od_a.yaml", first)
    repo.write("od_b.yaml", second)
    result = repo.check()
    cycles = sorted(
        (d.file, d.line, d.view, d.feature) for d in result.diagnostics.errors if d.code == "cycle"
    )
    assert cycles == [("features/od_a.yaml", 8, "od_a", "x"), ("features/od_b.yaml", 8, "od_b", "y")]
    assert result.on_demand == []


def test_an_on_demand_view_has_no_source_or_sla(repo: ScratchRepo) -> None:
    repo.write("od.yaml", GOOD.replace("owner: feed-ranking", "owner: feed-ranking\nsource: events"))
    [error] = repo.check().diagnostics.errors
    assert (error.code, error.line) == ("unknown-key", 9)


# --- never a traceback ----------------------------------------------------------------------------

TOKENS = st.sampled_from(
    ["a.x", "u.fav", "u.fav.top1", "i.id", "request.time", "request.nope", "1", "0", "2.5", "+", "-", "*",
     "/", "(", ")", ",", "min", "coalesce", "share_of", "same", "log1p", "abs", "x", "'", "..", "1e400"]
)  # fmt: skip
TYPES = {
    "a.x": SlotType(NUMBER),
    "u.fav": SlotType("top_k", "c"),
    "u.fav.top1": SlotType("id", "c"),
    "i.id": SlotType("id", "c"),
    "request.time": SlotType(NUMBER),
}


@FUZZ
@given(st.lists(TOKENS, min_size=0, max_size=14), st.lists(st.floats(allow_nan=True), min_size=4, max_size=4))
def test_token_soups_parse_or_fail_with_a_position(tokens: list[str], values: list[float]) -> None:
    text = " ".join(tokens)
    failed: ExprError | None = None
    try:
        ast = parse_value(text)
    except ExprError as exc:
        failed = exc
    if failed is not None:
        assert 0 <= failed.pos <= len(text)
        return
    assert from_json(to_json(ast)) == ast
    kind, problems = check_value(ast, lambda ref: TYPES.get(ref.name))
    if problems or kind is None:
        return
    cols = {
        "a.x": np.array(values[:2]),
        "u.fav.top1": np.array(values[2:]),
        "u.fav.share1": np.array([0.5, 0.5]),
        "i.id": np.array(values[1:3]),
        "request.time": 1.0,
    }
    with np.errstate(all="ignore"):
        out = evaluate(ast, cols, 2)
    assert out.shape == (2,)
    assert out.dtype == np.float64


YAML_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12)
    | st.sampled_from(["on_demand", "user_purchase_offline.avg_order_value_30d", "1 / 0", "od.f"]),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(["name", "expression", "x"]), inner, max_size=3),
    max_leaves=10,
)  # fmt: skip


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    st.fixed_dictionaries(
        {"feature_view": st.just("od"), "tier": st.just("on_demand")},
        optional={
            "inputs": YAML_VALUES,
            "owner": YAML_VALUES,
            "description": YAML_VALUES,
            "features": YAML_VALUES,
            "tags": YAML_VALUES,
            "entity": YAML_VALUES,
        },
    )
)  # fmt: skip
def test_random_on_demand_files_end_in_diagnostics(scratch: ScratchRepo, doc: dict[str, object]) -> None:
    scratch.write("od.yaml", yaml.safe_dump(doc))
    outcome = CliRunner().invoke(check, [str(scratch.root)])
    if outcome.exception is not None and not isinstance(outcome.exception, SystemExit):
        raise outcome.exception
    assert outcome.exit_code in (0, 1)
    assert "Traceback" not in outcome.output


def test_plan_lists_on_demand_views_against_the_applied_ones(repo: ScratchRepo, tmp_path: Path) -> None:
    from headwater.cli.registry import apply, plan

    state = tmp_path / "state"
    repo.write("pair_features.yaml", GOOD)

    def plan_text() -> str:
        outcome = CliRunner().invoke(plan, [str(repo.root), "--state-dir", str(state)])
        assert outcome.exit_code == 0, outcome.output
        return outcome.output

    assert "  + pair_features [on_demand] v" in plan_text()
    applied = CliRunner().invoke(apply, [str(repo.root), "--state-dir", str(state), "--no-feast"])
    assert applied.exit_code == 0, applied.output
    assert "  = pair_features [on_demand]" in plan_text()
    repo.write("pair_features.yaml", GOOD.replace("* 2 +", "* 3 +"))
    assert "  ! pair_features [on_demand]" in plan_text()


def test_features_list_and_describe_show_on_demand_views() -> None:
    from headwater.cli.registry import features

    listed = CliRunner().invoke(features, ["list", str(EXAMPLE)])
    assert listed.exit_code == 0, listed.output
    assert "user_item_on_demand                on_demand" in listed.output
    described = CliRunner().invoke(features, ["describe", "user_item_on_demand", str(EXAMPLE)])
    assert described.exit_code == 0, described.output
    assert "  - request_hour = request.hour_of_day" in described.output
