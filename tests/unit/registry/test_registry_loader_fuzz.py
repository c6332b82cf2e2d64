"""The loader never crashes: hostile YAML ends in diagnostics with a file and line, never a traceback.

First the four inputs that crashed it (issue 16 item 3), then property-based tests: random text,
random bytes, mutated views and random YAML trees written as a view file of a scratch repo, and
random token soups in `where`. Every one must end in ``headwater check`` exiting 0 or 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.cli.registry import check
from headwater.registry.diagnostics import Diagnostic
from headwater.registry.expr import MAX_NESTING, ExprError, from_json, parse, to_json
from headwater.registry.expr_eval import evaluate
from headwater.registry.expr_sql import to_sql
from headwater.registry.testing import MINIMAL_VIEW, ScratchRepo, line_of
from headwater.registry.yamlsrc import MAX_DEPTH, MAX_VALUES

EXAMPLE = Path(__file__).resolve().parents[3] / "features"
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Under 260 bytes that expand to over 5M values when every alias is copied out.
ALIAS_BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{name}: &{name} [{','.join([f'*{prev}'] * 9)}]\n" for prev, name in zip("abcdef", "bcdefg", strict=True)
)


def errors_of(repo: ScratchRepo) -> list[Diagnostic]:
    return list(repo.check().diagnostics.errors)


def cli_check(root: Path) -> tuple[int, str]:
    """Run ``headwater check`` in-process; a crash is an exception other than SystemExit."""
    result = CliRunner().invoke(check, [str(root)])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


@pytest.fixture
def repo(tmp_path: Path) -> ScratchRepo:
    return ScratchRepo(tmp_path / "features", template=EXAMPLE)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> ScratchRepo:
    """One repo for all examples of a property (hypothesis re-runs the body, not the fixture)."""
    return ScratchRepo(tmp_path_factory.mktemp("fuzz") / "features", template=EXAMPLE)


@pytest.mark.usefixtures("yaml_backend")
@pytest.mark.parametrize(
    "text",
    ["a: &x [*x]\n", "feature_view: &v\n  inner: *v\n", "a: &m {k: [1, {z: *m}]}\n"],
    ids=["list", "mapping", "nested"],
)
def test_recursive_alias_is_a_diagnostic(repo: ScratchRepo, text: str) -> None:
    repo.write("v1.yaml", text)
    [diag] = errors_of(repo)
    assert (diag.code, diag.file, diag.line) == ("yaml-alias", "features/v1.yaml", 1)
    assert "recursive alias" in diag.message


@pytest.mark.usefixtures("yaml_backend")
def test_alias_bomb_is_capped(repo: ScratchRepo) -> None:
    assert len(ALIAS_BOMB) < 260
    repo.write("v1.yaml", ALIAS_BOMB)
    [diag] = errors_of(repo)
    assert (diag.code, diag.file) == ("yaml-alias", "features/v1.yaml")
    assert f"more than {MAX_VALUES:,} values" in diag.message
    # The first top-level key whose expansion passes the cap ('a' to 'e' hold 74,732 values, 'f' 597,871).
    assert diag.line == line_of(ALIAS_BOMB, "f: &f")


@pytest.mark.usefixtures("yaml_backend")
def test_reused_anchor_within_the_cap_still_loads(repo: ScratchRepo) -> None:
    text = MINIMAL_VIEW.replace("owner: team-a", "owner: &o team-a") + "  - name: clicks_30s_b\n"
    text += "    agg: count\n    where: \"event_type = 'click'\"\n    window: 30s\n"
    text = text.replace("description: a small test view", "description: *o")
    repo.write("v1.yaml", text)
    result = repo.check()
    assert list(result.diagnostics.errors) == []
    assert result.views[0].description == "team-a"


@pytest.mark.usefixtures("yaml_backend")
@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 400, 5000])
def test_deep_nesting_is_a_diagnostic(repo: ScratchRepo, depth: int) -> None:
    text = "feature_view: v1\nfeatures:\n  - " + "[" * depth + "]" * depth + "\n"
    repo.write("v1.yaml", text)
    [diag] = errors_of(repo)
    assert diag.file == "features/v1.yaml"
    assert diag.code in ("too-deep", "bad-yaml")  # libyaml refuses past 1,000 levels itself
    assert diag.line == 3
    assert "nest" in diag.message


@pytest.mark.usefixtures("yaml_backend")
def test_nested_parentheses_in_where_are_a_diagnostic(repo: ScratchRepo) -> None:
    text = MINIMAL_VIEW.replace(
        "\"event_type = 'click'\"", '"' + "(" * 400 + "event_type = 'click'" + ")" * 400 + '"'
    )
    repo.write("v1.yaml", text)
    [diag] = errors_of(repo)
    assert (diag.code, diag.file, diag.line) == ("bad-where", "features/v1.yaml", line_of(text, "where:"))
    assert f"deeper than {MAX_NESTING} levels" in diag.message


def test_non_utf8_file_is_a_diagnostic(repo: ScratchRepo) -> None:
    path = repo.root / "v1.yaml"
    path.write_bytes(MINIMAL_VIEW.encode().replace(b"a small test view", b"caf\xe9 view"))
    [diag] = errors_of(repo)
    assert (diag.code, diag.file, diag.line) == ("bad-encoding", "features/v1.yaml", 8)
    assert "0xe9" in diag.message
    assert diag.hint is not None
    assert "UTF-8" in diag.hint


def test_non_utf8_shared_file_is_a_diagnostic(repo: ScratchRepo) -> None:
    (repo.root / "entities.yaml").write_bytes(b"entities:\n  - name: \xff\n")
    assert [(d.code, d.file, d.line) for d in errors_of(repo) if d.code == "bad-encoding"] == [
        ("bad-encoding", "features/entities.yaml", 2)
    ]


def test_integer_too_long_for_python_is_a_diagnostic(repo: ScratchRepo) -> None:
    text = MINIMAL_VIEW.replace("compute_cost: 10", "compute_cost: " + "9" * 5000)
    repo.write("v1.yaml", text)
    [diag] = errors_of(repo)
    assert (diag.code, diag.line) == ("bad-yaml", line_of(text, "compute_cost"))
    assert "5000 digits" in diag.message


def test_check_cli_exits_1_with_file_and_line_on_each_crasher(repo: ScratchRepo) -> None:
    repo.write("a.yaml", "a: &x [*x]\n")
    repo.write("b.yaml", ALIAS_BOMB)
    (repo.root / "c.yaml").write_bytes(b"feature_view: v\n\xff\n")
    code, output = cli_check(repo.root)
    assert code == 1
    assert "features/a.yaml:1: error [yaml-alias]" in output
    assert "features/b.yaml:6: error [yaml-alias]" in output
    assert "features/c.yaml:2: error [bad-encoding]" in output


# --- properties: every input ends in exit 0 or 1 ------------------------------------------------


def assert_checks(scratch: ScratchRepo, content: str | bytes) -> None:
    path = scratch.root / "fuzzed.yaml"
    path.write_bytes(content.encode("utf-8", "surrogatepass") if isinstance(content, str) else content)
    code, output = cli_check(scratch.root)
    assert code in (0, 1)
    if code == 1:
        assert "error [" in output


@FUZZ
@given(text=st.text(max_size=400))
def test_random_text_never_crashes(scratch: ScratchRepo, text: str) -> None:
    assert_checks(scratch, text)


@FUZZ
@given(data=st.binary(max_size=400))
def test_random_bytes_never_crash(scratch: ScratchRepo, data: bytes) -> None:
    assert_checks(scratch, data)


YAML_BITS = st.sampled_from(
    [
        "&a ",
        "*a",
        "[",
        "]",
        "{",
        "}",
        ": ",
        "- ",
        "\n",
        "  ",
        "'",
        '"',
        "#",
        "!!str ",
        "!tag ",
        "? ",
        "|",
        ">",
        "---\n",
        "...\n",
        "<<: *a\n",
        "1e999",
        "-.inf",
        "0x1F",
        "~",
        "null",
        "yes",
        "\t",
        "\\",
        "%YAML 1.2\n",
        "\x00",
        "\ufeff",
        "é",
        "🦄",
    ]
)


@FUZZ
@given(cuts=st.lists(st.tuples(st.integers(0, len(MINIMAL_VIEW)), YAML_BITS, st.integers(0, 3)), max_size=6))
def test_mutated_views_never_crash(scratch: ScratchRepo, cuts: list[tuple[int, str, int]]) -> None:
    text = MINIMAL_VIEW
    for at, bit, drop in cuts:
        text = text[:at] + bit + text[at + drop :]
    assert_checks(scratch, text)


VIEW_KEYS = [
    "feature_view",
    "entity",
    "source",
    "tier",
    "freshness_sla",
    "compute_cost",
    "owner",
    "description",
    "features",
    "name",
    "agg",
    "where",
    "window",
    "field",
    "k",
    "dtype",
    "ttl",
]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.sampled_from(
        [
            "events",
            "user",
            "realtime",
            "nearline",
            "offline",
            "count",
            "sum",
            "30s",
            "PT10S",
            "event_type = 'click'",
            "price",
            "2h",
            "-1s",
            "0s",
            "P1000Y",
        ]
    ),
)
TREES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(VIEW_KEYS), st.text(max_size=8)), inner, max_size=6),
    ),
    max_leaves=30,
)


@FUZZ
@given(
    header=st.fixed_dictionaries({}, optional={k: SCALARS for k in VIEW_KEYS[:8]}),
    features=st.lists(st.dictionaries(st.sampled_from(VIEW_KEYS[9:]), TREES, max_size=6), max_size=3),
    extra=st.dictionaries(st.sampled_from(VIEW_KEYS), TREES, max_size=2),
)
def test_random_view_trees_never_crash(
    scratch: ScratchRepo,
    header: dict[str, object],
    features: list[dict[str, object]],
    extra: dict[str, object],
) -> None:
    assert_checks(scratch, yaml.safe_dump({**header, "features": features, **extra}, allow_unicode=True))


@FUZZ
@given(shared=st.sampled_from(["entities.yaml", "sources.yaml", "budget.yaml"]), tree=TREES)
def test_random_shared_files_never_crash(
    tmp_path_factory: pytest.TempPathFactory, shared: str, tree: object
) -> None:
    repo = ScratchRepo(tmp_path_factory.mktemp("shared") / "features", template=EXAMPLE)
    repo.write(shared, yaml.safe_dump(tree, allow_unicode=True))
    code, _ = cli_check(repo.root)
    assert code in (0, 1)


BUDGET = yaml.safe_load((EXAMPLE / "budget.yaml").read_text(encoding="utf-8"))


@FUZZ
@given(data=st.data())
def test_mutated_budget_never_crashes(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    """The real budget.yaml with one value replaced: a tier CPU, a state or memory line, an entity count."""
    budget = json.loads(json.dumps(BUDGET))
    node = budget
    while True:
        key = data.draw(st.sampled_from(sorted(node)))
        if not isinstance(node[key], dict) or data.draw(st.booleans()):
            node[key] = data.draw(TREES)
            break
        node = node[key]
    repo = ScratchRepo(tmp_path_factory.mktemp("budget") / "features", template=EXAMPLE)
    repo.write("budget.yaml", yaml.safe_dump(budget, allow_unicode=True))
    code, output = cli_check(repo.root)
    assert code in (0, 1)
    if code == 1:
        assert "budget.yaml" in output


# --- the `where` grammar ------------------------------------------------------------------------

WHERE_TOKENS = st.sampled_from(
    [
        "event_type",
        "price",
        "item_id",
        "device",
        "query",
        "position",
        "dwell_ms",
        "colour",
        "user_id",
        "=",
        "==",
        "!=",
        "<>",
        "<",
        "<=",
        ">",
        ">=",
        "and",
        "or",
        "not",
        "in",
        "is",
        "null",
        "true",
        "false",
        "(",
        ")",
        ",",
        "'click'",
        "'it''s'",
        '"web"',
        "'",
        "1",
        "-2.5",
        "1e308",
        "1e999",
        ".5",
        "99999999999999999999",
        ";",
        "\\",
        "é",
    ]
)
WHERE_TEXT = st.one_of(st.lists(WHERE_TOKENS, max_size=25).map(" ".join), st.text(max_size=60))


@settings(max_examples=2000, deadline=None)
@given(text=WHERE_TEXT)
def test_where_parser_returns_an_ast_or_an_expr_error(text: str) -> None:
    try:
        expr = parse(text)
    except ExprError as exc:
        error: ExprError | None = exc
    else:
        error = None
    if error is not None:
        assert 0 <= error.pos <= len(text)
        return
    assert from_json(json.loads(json.dumps(to_json(expr)))) == expr
    for dialect in ("flink", "spark"):
        assert to_sql(expr, dialect)
    assert evaluate(expr, {}) in (True, False, None)


@settings(max_examples=200, deadline=None)
@given(depth=st.integers(0, 2000), opener=st.sampled_from(["(", "not ", "not ("]))
def test_where_nesting_is_capped_not_a_recursion_error(depth: int, opener: str) -> None:
    closer = ")" * opener.count("(")
    text = opener * depth + "price > 1" + closer * depth
    if depth * (1 if opener != "not (" else 2) <= MAX_NESTING:
        parse(text)
    else:
        with pytest.raises(ExprError, match="nest deeper"):
            parse(text)


@FUZZ
@given(text=WHERE_TEXT)
def test_where_in_a_view_ends_in_diagnostics(scratch: ScratchRepo, text: str) -> None:
    # JSON strings are YAML double-quoted scalars (control characters come out escaped).
    assert_checks(scratch, MINIMAL_VIEW.replace("\"event_type = 'click'\"", json.dumps(text)))
