"""A feature's ``expect:`` block: parsed, located diagnostics for each mistake, no part of a version."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.registry.diagnostics import Diagnostic
from headwater.registry.models import ExpectationSpec
from headwater.registry.plans import plan_views, registry_hash
from headwater.registry.testing import MINIMAL_VIEW as VIEW
from headwater.registry.testing import ScratchRepo as Repo
from headwater.registry.testing import line_of

WINDOW = "    window: 30s"


def _with(expect: str) -> str:
    return VIEW.replace(WINDOW, f"{WINDOW}\n    expect:\n{expect}")


def _errors(repo: Repo, text: str) -> list[Diagnostic]:
    repo.write("v1.yaml", text)
    return repo.check().diagnostics.errors


def test_expectations_compile_onto_the_feature(repo: Repo) -> None:
    text = _with("      min: 0\n      max: 100\n      max_missing_rate: 0.05\n      max_drift_psi: 0.2\n")
    repo.write("v1.yaml", text)
    result = repo.check()
    assert result.diagnostics.items == []
    expect = result.views[0].features[0].expect
    assert expect == ExpectationSpec(min=0.0, max=100.0, max_missing_rate=0.05, max_drift_psi=0.2)


def test_expectations_version_nothing(repo: Repo) -> None:
    repo.write("v1.yaml", VIEW)
    before = repo.check()
    repo.write("v1.yaml", _with("      max_missing_rate: 0.5\n"))
    after = repo.check()
    assert [v.version for v in plan_views(after)] == [v.version for v in plan_views(before)]
    assert registry_hash(after) == registry_hash(before)


@pytest.mark.usefixtures("yaml_backend")
def test_unknown_key_names_line_feature_and_the_right_key(repo: Repo) -> None:
    text = _with("      max_mising_rate: 0.1\n")
    diag = next(d for d in _errors(repo, text) if d.code == "unknown-key")
    assert (diag.file, diag.line) == ("features/v1.yaml", line_of(text, "max_mising_rate"))
    assert (diag.view, diag.feature) == ("v1", "clicks_30s")
    assert diag.hint == "did you mean 'max_missing_rate'?"


@pytest.mark.parametrize(
    ("body", "needle", "words"),
    [
        ("      min: 5\n      max: 1\n", "min: 5", "min 5 is above max 1: swap them"),
        ("      max_missing_rate: 1.5\n", "max_missing_rate", "less than or equal to 1"),
        ("      max_drift_ks: -0.1\n", "max_drift_ks", "greater than or equal to 0"),
        ("      min: low\n", "min: low", "valid number"),
        ("      min: .nan\n", "min: .nan", "finite number"),
        ("      {}\n", "expect:", "an empty expect block checks nothing"),
    ],
)
def test_bad_values_say_what_to_fix(repo: Repo, body: str, needle: str, words: str) -> None:
    text = _with(body)
    diags = _errors(repo, text)
    assert len(diags) == 1, [d.format() for d in diags]
    diag = diags[0]
    assert diag.code == "bad-value"
    assert (diag.view, diag.feature) == ("v1", "clicks_30s")
    assert diag.line in (line_of(text, needle), line_of(text, "expect:"))
    assert words in (diag.expected or "")


def test_a_range_on_dictionary_ids_is_refused(repo: Repo) -> None:
    text = (
        VIEW.replace("agg: count", "agg: top_k\n    field: category\n    k: 3")
        .replace("where: \"event_type = 'click'\"", 'where: "category is not null"')
        .replace(WINDOW, f"{WINDOW}\n    expect: {{max: 3, max_missing_rate: 0.2}}")
    )
    diags = _errors(repo, text)
    assert [(d.code, d.line, d.feature) for d in diags] == [
        ("bad-value", line_of(text, "expect:"), "clicks_30s")
    ]
    assert "dictionary ids" in diags[0].message
    assert "max_missing_rate and max_drift_psi/max_drift_ks apply to any feature" in (diags[0].hint or "")


def test_the_example_repo_declares_expectations(example: Path) -> None:
    from headwater.registry.validate import check_repo

    result = check_repo(example)
    assert result.ok
    view = next(v for v in result.views if v.name == "user_session_realtime")
    expects = {f.name: f.expect for f in view.features if f.expect is not None}
    assert expects == {
        "clicks_5m": ExpectationSpec(min=0.0, max_missing_rate=0.01, max_drift_psi=0.25),
        "ctr_5m": ExpectationSpec(min=0.0, max=1.0, max_drift_psi=0.25),
    }


_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text("ab1.", max_size=5),
    st.just([1]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    block=st.dictionaries(
        st.sampled_from(["min", "max", "max_missing_rate", "max_drift_psi", "max_drift_ks", "mx"]), _VALUE
    )
)
def test_any_expect_block_loads_or_gives_located_diagnostics(repo: Repo, block: dict[str, object]) -> None:
    import json

    text = VIEW.replace(
        WINDOW, f"{WINDOW}\n    expect: {json.dumps(block, allow_nan=True).replace('NaN', '.nan')}"
    )
    repo.write("v1.yaml", text)
    result = repo.check()  # never raises
    for diag in result.diagnostics.errors:
        assert diag.file == "features/v1.yaml"
        assert diag.line >= line_of(text, "expect:")
        assert diag.feature == "clicks_30s"
        assert diag.hint
    if result.ok:
        expect = result.views[0].features[0].expect
        assert expect is not None
        assert expect.min is None or expect.max is None or expect.min <= expect.max
