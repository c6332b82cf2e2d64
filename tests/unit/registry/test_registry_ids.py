"""A source's ``ids:`` block in sources.yaml: defaults, resolution into the plan, and bad values named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.registry.diagnostics import Diagnostic
from headwater.registry.plans import plan_source
from headwater.registry.sources import DEFAULT_ID_CHARSET, DEFAULT_ID_MAX_BYTES
from headwater.registry.testing import ScratchRepo as Repo
from headwater.registry.testing import line_of

ANCHOR = "    event_id: payment_id\n"


def with_ids(repo: Repo, block: str) -> str:
    text = (repo.root / "sources.yaml").read_text()
    assert ANCHOR in text
    text = text.replace(ANCHOR, ANCHOR + block)
    repo.write("sources.yaml", text)
    return text


def errors(repo: Repo) -> list[Diagnostic]:
    return [d for d in repo.check().diagnostics.items if d.severity == "error"]


def test_unset_ids_take_the_registry_defaults(repo: Repo) -> None:
    result = repo.check()
    assert result.ok
    for name in ("events", "payments"):
        src = plan_source(result.sources[name])
        assert (
            (src.id_max_bytes, src.id_charset) == (DEFAULT_ID_MAX_BYTES, DEFAULT_ID_CHARSET) == (256, "any")
        )


@pytest.mark.parametrize(
    ("block", "want"),
    [
        ("    ids: {max_bytes: 64, charset: printable}\n", (64, "printable")),
        ("    ids:\n      charset: printable\n", (256, "printable")),
        ("    ids: {max_bytes: 4096}\n", (4096, "any")),
        ("    ids: {}\n", (256, "any")),
    ],
)
def test_an_ids_block_resolves_into_the_plan(repo: Repo, block: str, want: tuple[int, str]) -> None:
    with_ids(repo, block)
    result = repo.check()
    assert result.ok, [d.format() for d in result.diagnostics.items]
    pay = plan_source(result.sources["payments"])
    assert (pay.id_max_bytes, pay.id_charset) == want
    assert plan_source(result.sources["events"]).id_charset == "any"  # per source


def test_a_non_default_policy_is_a_new_view_version_the_default_is_not(repo: Repo) -> None:
    from headwater.registry.plans import build_plans, registry_hash

    def versions() -> dict[str, str]:
        result = repo.check()
        plans = build_plans(result, registry_hash(result))
        return {v.name: v.version for p in plans.values() for v in p.views if v.source == "payments"}

    before = versions()
    text = (repo.root / "sources.yaml").read_text()
    with_ids(repo, "    ids: {max_bytes: 256, charset: any}\n")
    assert versions() == before  # spelling out the defaults changes nothing
    repo.write("sources.yaml", text)
    with_ids(repo, "    ids: {charset: printable}\n")
    after = versions()
    assert after.keys() == before.keys()
    assert all(after[k] != before[k] for k in before)


@pytest.mark.parametrize(
    ("block", "needle", "found"),
    [
        ("    ids: {max_bytes: 0}\n", "max_bytes", "0"),
        ("    ids: {max_bytes: 5000}\n", "max_bytes", "5000"),
        ('    ids: {max_bytes: "256"}\n', "max_bytes", "256"),
        ("    ids: {max_bytes: 25.5}\n", "max_bytes", "25.5"),
        ("    ids: {charset: ascii}\n", "charset", "ascii"),
        ("    ids: {charsets: printable}\n", "charsets", "charsets"),
        ("    ids: printable\n", "ids", "printable"),
    ],
)
def test_bad_ids_values_name_file_line_and_the_fix(repo: Repo, block: str, needle: str, found: str) -> None:
    text = with_ids(repo, block)
    errs = errors(repo)
    assert len(errs) == 1, [d.format() for d in errs]
    diag = errs[0]
    assert diag.file == "features/sources.yaml"
    assert diag.line == line_of(text, "ids:")
    shown = diag.format()
    assert needle in shown, shown
    assert found in shown, shown
    assert diag.expected or diag.hint, shown


def test_headwater_check_refuses_a_bad_charset_with_file_and_line(repo: Repo) -> None:
    text = with_ids(repo, "    ids: {charset: ascii}\n")
    exe = str(Path(sys.executable).parent / "headwater")
    done = subprocess.run([exe, "check", str(repo.root)], capture_output=True, text=True, check=False)
    assert done.returncode != 0
    out = done.stdout + done.stderr
    assert f"sources.yaml:{line_of(text, 'ids:')}" in out, out
    assert "expected: one of any or printable" in out, out
    assert "'ascii'" in out, out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    value=st.one_of(
        st.integers(-10, 10_000),
        st.text(max_size=12),
        st.floats(allow_nan=False),
        st.booleans(),
        st.none(),
        st.lists(st.integers(), max_size=2),
    ),
    key=st.sampled_from(["max_bytes", "charset"]),
)
def test_any_ids_value_is_accepted_only_when_valid_and_never_crashes(
    repo: Repo, value: object, key: str
) -> None:
    text = (repo.root / "sources.yaml").read_text()
    block = "    ids: " + yaml.safe_dump({key: value}, default_flow_style=True).strip() + "\n"
    with_ids(repo, block)
    try:
        result = repo.check()
    finally:
        repo.write("sources.yaml", text)
    if key == "max_bytes":
        valid = value is None or (type(value) is int and 1 <= value <= 4096)
    else:
        valid = value is None or value in ("any", "printable")
    assert result.ok == valid, (block, [d.format() for d in result.diagnostics.items])
