"""A view's ``late:`` policy: onto the plan, a located diagnostic for a bad value, versions nothing."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.registry.plans import plan_views, registry_hash
from headwater.registry.testing import MINIMAL_VIEW as VIEW
from headwater.registry.testing import ScratchRepo as Repo
from headwater.registry.testing import line_of


def _with(late: str) -> str:
    return VIEW.replace("owner: team-a\n", f"owner: team-a\nlate: {late}\n")


@pytest.mark.parametrize("policy", ["drop", "heal"])
def test_the_policy_reaches_the_plan(repo: Repo, policy: str) -> None:
    repo.write("v1.yaml", _with(policy))
    result = repo.check()
    assert result.diagnostics.errors == []
    assert [v.late for v in plan_views(result)] == [policy]


def test_default_is_drop_and_keeps_the_hash(repo: Repo) -> None:
    repo.write("v1.yaml", VIEW)
    unset = repo.check()
    repo.write("v1.yaml", _with("drop"))
    explicit = repo.check()
    assert [v.late for v in plan_views(unset)] == ["drop"]
    assert registry_hash(explicit) == registry_hash(unset)


def test_heal_versions_nothing(repo: Repo) -> None:
    repo.write("v1.yaml", VIEW)
    before = repo.check()
    repo.write("v1.yaml", _with("heal"))
    after = repo.check()
    assert [v.version for v in plan_views(after)] == [v.version for v in plan_views(before)]
    assert registry_hash(after) != registry_hash(before)  # the registry did change: its hash says so


@pytest.mark.usefixtures("yaml_backend")
def test_bad_value_names_file_line_view_and_fix(repo: Repo) -> None:
    text = _with("keep")
    repo.write("v1.yaml", text)
    diags = repo.check().diagnostics.errors
    assert [(d.code, d.file, d.line, d.view) for d in diags] == [
        ("bad-value", "features/v1.yaml", line_of(text, "late: keep"), "v1")
    ]
    assert diags[0].expected == "drop or heal"
    assert diags[0].found == "'keep' (str)"
    assert "late: heal" in diags[0].hint


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    value=st.one_of(
        # the BMP only: JSON escapes an astral char as a surrogate pair, which YAML refuses
        st.text(st.characters(categories=["L", "N", "P", "Zs"], max_codepoint=0xFFFF), max_size=12),
        st.integers(),
        st.booleans(),
    )
)
def test_any_other_value_is_one_located_diagnostic(repo: Repo, value: object) -> None:
    """Whatever YAML gives for ``late``, it is a policy or one diagnostic on its line, never a traceback."""
    import json

    shown = json.dumps(value)  # a JSON scalar is a YAML scalar: the loader sees ``value`` itself
    text = _with(shown)
    repo.write("v1.yaml", text)
    result = repo.check()
    if value in ("drop", "heal"):
        assert [v.late for v in plan_views(result)] == [value]
        return
    diags = result.diagnostics.errors
    assert [(d.code, d.line) for d in diags] == [("bad-value", line_of(text, "late: "))]
    assert diags[0].expected == "drop or heal"
