"""A serving config file is user input: loading it ends in a config or a ServingConfigError, never a crash.

The service reads this file at start-up (`headwater serve --config`), so a traceback here is a crash
on deploy. The error must name the file; for a field error, the field.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.serving.config import ServingConfig, ServingConfigError, load_config

FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
DEMO = Path(__file__).resolve().parents[3] / "infra" / "demo" / "serving.yaml"

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
TREES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


def _demo_keys() -> dict[str, object]:
    loaded = yaml.safe_load(DEMO.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def assert_loads_or_explains(path: Path) -> None:
    try:
        config: ServingConfig | ServingConfigError = load_config(path)
    except ServingConfigError as exc:
        config = exc
    if isinstance(config, ServingConfigError):
        assert str(path) in str(config), f"the error does not name the file: {config}"
    else:
        assert isinstance(config, ServingConfig)


def test_the_demo_config_loads() -> None:
    assert isinstance(load_config(DEMO), ServingConfig)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("batcher: {max_batch_rows: -3}\n", "batcher.max_batch_rows"),
        ("admission: {classes: {vip: {rate_per_s: fast}}}\n", "admission.classes.vip.rate_per_s"),
        ("no_such_field: 1\n", "no_such_field"),
    ],
)
def test_a_field_error_names_the_file_and_the_field(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "serving.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ServingConfigError) as caught:
        load_config(path)
    assert str(path) in str(caught.value)
    assert field in str(caught.value)


def test_non_utf8_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "serving.yaml"
    path.write_bytes(b"batcher:\n  max_batch_rows: \xff\xfe\n")
    with pytest.raises(ServingConfigError, match="UTF-8"):
        load_config(path)


def test_recursive_alias_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "serving.yaml"
    path.write_text("batcher: &a {nested: *a}\n", encoding="utf-8")
    with pytest.raises(ServingConfigError):
        load_config(path)


def test_a_folder_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ServingConfigError, match="cannot be read"):
        load_config(tmp_path)


@FUZZ
@given(data=st.binary(max_size=300))
def test_random_bytes_never_crash(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "serving.yaml"
    path.write_bytes(data)
    assert_loads_or_explains(path)


@FUZZ
@given(tree=TREES)
def test_random_trees_never_crash(tmp_path: Path, tree: object) -> None:
    path = tmp_path / "serving.yaml"
    path.write_text(yaml.safe_dump(tree, allow_unicode=True), encoding="utf-8")
    assert_loads_or_explains(path)


@FUZZ
@given(data=st.data())
def test_mutated_demo_config_never_crashes(tmp_path: Path, data: st.DataObject) -> None:
    """Replace one value anywhere in the demo's config with a random tree: known keys, hostile values."""
    config = _demo_keys()
    node: object = config
    while isinstance(node, dict) and node:
        key = data.draw(st.sampled_from(sorted(node, key=str)))
        if not isinstance(node[key], dict) or data.draw(st.booleans()):
            node[key] = data.draw(TREES)
            break
        node = node[key]
    path = tmp_path / "serving.yaml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    assert_loads_or_explains(path)
