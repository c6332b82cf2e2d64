"""Durations and the YAML reader (both composers)."""

from __future__ import annotations

import pytest

from headwater.registry.durations import DurationError, format_seconds, parse_duration
from headwater.registry.yamlsrc import YamlSyntaxError, parse_yaml


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("5m", 300),
        ("1h", 3600),
        ("7d", 604800),
        ("2w", 1209600),
        ("250ms", 0.25),
        ("PT5S", 5),
        ("PT3M", 180),
        ("P1D", 86400),
        ("P30D", 2592000),
        ("P1DT12H", 129600),
        ("pt1.5s", 1.5),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text).seconds == seconds


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("P1M", "months"),
        ("P1Y", "months"),
        ("5 minutes", "expected"),
        ("PT", "expected"),
        ("0s", "zero"),
        ("-5s", "expected"),
    ],
)
def test_bad_durations(text: str, fragment: str) -> None:
    with pytest.raises(DurationError, match=fragment):
        parse_duration(text)


def test_format_seconds() -> None:
    assert [format_seconds(s) for s in (5, 180, 3600, 86400, 90, 0.5)] == [
        "5s",
        "3m",
        "1h",
        "1d",
        "90s",
        "500ms",
    ]


@pytest.mark.usefixtures("yaml_backend")
def test_yaml_core_schema_and_lines() -> None:
    doc = parse_yaml("a: no\nb: 1:30\nc: 0.5\nd: '7'\ne: ~\nf: [1, true]\ng:\n  - x: 1\n    y: 2\n")
    assert doc.data == {
        "a": "no",
        "b": "1:30",
        "c": 0.5,
        "d": "7",
        "e": None,
        "f": [1, True],
        "g": [{"x": 1, "y": 2}],
    }
    assert doc.lines[("g", 0, "y")] == 9
    assert doc.line_of(("g", 0, "missing")) == 8
    assert doc.line_of(("nope",)) == 1


@pytest.mark.usefixtures("yaml_backend")
def test_yaml_errors_have_lines() -> None:
    with pytest.raises(YamlSyntaxError) as info:
        parse_yaml("a: 1\nb: [1\nc: 2\n")
    assert info.value.line >= 2
    with pytest.raises(YamlSyntaxError, match="duplicate key 'a'") as dup:
        parse_yaml("a: 1\nb: 2\na: 3\n")
    assert dup.value.line == 3
