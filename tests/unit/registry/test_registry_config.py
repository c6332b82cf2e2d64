"""headwater.yaml and the one resolver: discovery, precedence, errors with file and line, init."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.registry import config as cfg
from headwater.registry.init import TEMPLATE, InitError, scaffold
from headwater.registry.resources import checkout_root
from headwater.registry.validate import check_repo

ENV = (
    "HEADWATER_REPO",
    "HEADWATER_STATE_DIR",
    "HEADWATER_LAKE",
    "HEADWATER_JVM_LIB",
    "HEADWATER_KAFKA_BOOTSTRAP",
    "HEADWATER_REDIS_URL",
    "HEADWATER_HOST",
    "HEADWATER_KAFKA_PORT",
    "HEADWATER_REDIS_PORT",
    "HEADWATER_DLQ_TOPIC",
    "HEADWATER_PARTITIONS",
)


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A clean working folder: no HEADWATER_* variable, and no headwater.yaml above it."""
    for name in ENV:
        monkeypatch.setenv(name, "")  # recorded, so that whatever the test (or --repo) sets is undone
        monkeypatch.delenv(name)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert cfg.find_config(work) is None
    return work


def write(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / cfg.CONFIG_FILE
    path.write_text(text, encoding="utf-8")
    return path


def test_without_a_config_everything_is_relative_to_the_current_folder(here: Path) -> None:
    found = cfg.resolve()
    assert found.config_file is None
    assert found.features == here / "features"
    assert found.state_dir == here / ".headwater"
    assert found.lake == here / ".headwater" / "lake"
    assert found.kafka_bootstrap == "127.0.0.1:9092"
    assert found.redis_url == "redis://127.0.0.1:6379/0"
    assert set(found.origins.values()) == {"default", "default: lake/ in the state folder"}


def test_config_found_from_a_subfolder_paths_relative_to_it(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(
        here / "proj",
        "features: defs\nstate_dir: var/state\nkafka:\n  bootstrap: k1:9093,k2:9093\n"
        "redis:\n  url: redis://r:6380/2\n",
    )
    deep = here / "proj" / "a" / "b"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    found = cfg.resolve()
    assert found.config_file == path
    assert found.root == here / "proj"
    assert found.features == here / "proj" / "defs"
    assert found.state_dir == here / "proj" / "var" / "state"
    assert found.lake == here / "proj" / "var" / "state" / "lake"  # the lake follows the state folder
    assert (found.kafka_bootstrap, found.redis_url) == ("k1:9093,k2:9093", "redis://r:6380/2")
    assert found.origins["state_dir"] == f"{path}:2"
    assert found.origins["kafka.bootstrap"] == f"{path}:4"
    assert found.origins["lake"] == "default: lake/ in the state folder"


def test_environment_overrides_the_file(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(here, "state_dir: s\nlake: /data/lake\nkafka:\n  bootstrap: k:1\nredis:\n  url: redis://r:2/0\n")
    monkeypatch.setenv("HEADWATER_STATE_DIR", str(here / "elsewhere"))
    monkeypatch.setenv("HEADWATER_KAFKA_PORT", "19092")
    monkeypatch.setenv("HEADWATER_REDIS_URL", "redis://other:7000/1")
    found = cfg.resolve()
    assert found.state_dir == here / "elsewhere"
    assert found.lake == Path("/data/lake")  # named in the file: the state variable does not move it
    assert found.kafka_bootstrap == "127.0.0.1:19092"  # a port override beats the file (infra/ scripts)
    assert found.redis_url == "redis://other:7000/1"
    assert found.origins["state_dir"] == "$HEADWATER_STATE_DIR"
    assert found.origins["kafka.bootstrap"] == "$HEADWATER_KAFKA_PORT"


def test_topic_layout_from_the_file_or_the_environment(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(here, "kafka:\n  dlq_topic: team-a.dlq\n  partitions: 12\n")
    assert (cfg.resolve().dlq_topic, cfg.resolve().partitions) == ("team-a.dlq", 12)
    monkeypatch.setenv("HEADWATER_PARTITIONS", "3")
    assert cfg.resolve().partitions == 3
    monkeypatch.setenv("HEADWATER_PARTITIONS", "three")
    with pytest.raises(cfg.ConfigError, match=r"PARTITIONS='three': expected a whole number >= 1"):
        cfg.resolve()


def test_state_variable_moves_the_lake_when_the_file_does_not_name_one(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEADWATER_STATE_DIR", str(here / "st"))
    assert cfg.lake_dir() == here / "st" / "lake"
    assert cfg.lake_dir("given") == Path("given")
    assert cfg.state_dir(Path("opt")) == Path("opt")


def test_repo_variable_names_the_config(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = write(here.parent / "other", "state_dir: st\n")
    monkeypatch.setenv("HEADWATER_REPO", str(other.parent))
    assert cfg.resolve().state_dir == other.parent / "st"
    monkeypatch.setenv("HEADWATER_REPO", str(here / "missing"))
    with pytest.raises(cfg.ConfigError, match=r"missing: no headwater.yaml there; create a feature repo"):
        cfg.resolve()


@pytest.mark.parametrize(
    ("text", "line", "needle"),
    [
        ("state_dir: s\nlaek: x\n", 2, "unknown key 'laek': remove it or fix its spelling (known: version,"),
        ("kafka:\n  bootstrap: a:1\n  bootstarp: b\n", 3, "unknown key 'kafka.bootstarp'"),
        ("features: f\nstate_dir: 5\n", 2, "state_dir: Input should be a valid string (found 5)"),
        ("kafka:\n  bootstrap: localhost\n", 2, "'localhost' is not host:port"),
        ("redis:\n  url: http://r:1\n", 2, "is not a Redis URL"),
        ("kafka:\n  partitions: 0\n", 2, "kafka.partitions: Input should be greater than or equal to 1"),
        ("kafka:\n  partitions: '4'\n", 2, "kafka.partitions: Input should be a valid integer (found '4')"),
        ("version: 2\n", 1, "version: Input should be 1"),
        ("state_dir: s\nfeatures: .\n", 2, "features must be a folder of its own (e.g. features/)"),
        ("state_dir: [a\n", 2, "not valid YAML"),
        ("- a\n- b\n", 1, "must be a mapping"),
    ],
)
def test_errors_name_file_line_and_fix(here: Path, text: str, line: int, needle: str) -> None:
    path = write(here, text)
    with pytest.raises(cfg.ConfigError) as err:
        cfg.resolve()
    assert str(err.value).startswith(f"{path}:{line}: ")
    assert needle in str(err.value)


def test_config_is_frozen_and_an_edited_file_is_read_again(here: Path) -> None:
    path = write(here, "state_dir: one\n")
    loaded = cfg.load_config(path)
    with pytest.raises(ValueError, match="frozen"):
        loaded.config.state_dir = "x"  # type: ignore[misc]
    assert cfg.resolve().state_dir == here / "one"
    path.write_text("state_dir: two\n", encoding="utf-8")  # same size, same second: still read again
    assert cfg.resolve().state_dir == here / "two"


# A leading "x": never a YAML word (null, true, no...) that would not be a string key.
KEYS = st.text(alphabet=string.ascii_lowercase + "_", max_size=12).map(lambda k: "x" + k)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    known=st.lists(st.sampled_from(["features: f", "state_dir: s", "lake: l"]), unique=True),
    unknown=KEYS.filter(lambda k: k not in cfg.RepoConfig.model_fields),
    position=st.integers(min_value=0, max_value=3),
)
def test_unknown_key_reported_at_its_line(here: Path, known: list[str], unknown: str, position: int) -> None:
    lines = list(known)
    at = min(position, len(lines))
    lines.insert(at, f"{unknown}: 1")
    path = write(here, "\n".join(lines) + "\n")
    with pytest.raises(cfg.ConfigError) as err:
        cfg.load_config(path)
    assert str(err.value) == (
        f"{path}:{at + 1}: unknown key {unknown!r}: remove it or fix its spelling "
        f"(known: {', '.join(cfg.RepoConfig.model_fields)})"
    )


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=60))
def test_any_text_is_a_config_or_a_config_error(here: Path, text: str) -> None:
    path = here / cfg.CONFIG_FILE
    path.write_text(text, encoding="utf-8")
    try:
        loaded = cfg.load_config(path)
    except cfg.ConfigError as exc:
        message = str(exc)
    else:
        assert isinstance(loaded.config, cfg.RepoConfig)
        return
    assert message.startswith(f"{path}:")


def test_init_writes_a_repo_that_checks_and_refuses_to_overwrite(here: Path) -> None:
    config = scaffold(here / "repo", "127.0.0.1:9092", "redis://127.0.0.1:6379/0")
    assert config == here / "repo" / "headwater.yaml"
    assert config.read_text(encoding="utf-8") == TEMPLATE.format(
        kafka="127.0.0.1:9092", redis="redis://127.0.0.1:6379/0"
    )
    assert (here / "repo" / "features" / "schemas" / "payment_event.avsc").is_file()
    result = check_repo(here / "repo" / "features")
    assert result.ok, [d.format() for d in result.diagnostics.errors]
    with pytest.raises(InitError, match="already exists"):
        scaffold(here / "repo", "127.0.0.1:9092", "redis://127.0.0.1:6379/0")
    with pytest.raises(ValueError, match="not host:port"):
        scaffold(here / "bad", "nohost", "redis://127.0.0.1:6379/0")
    assert not (here / "bad").exists()  # nothing half-made


def test_cli_repo_option_drives_config_apply_and_the_state_folder(here: Path) -> None:
    from headwater.cli.main import main

    runner = CliRunner()
    made = runner.invoke(main, ["init", str(here / "mine")])
    assert made.exit_code == 0, made.output
    shown = runner.invoke(main, ["--repo", str(here / "mine"), "config", "--format", "json"])
    assert shown.exit_code == 0, shown.output
    values = json.loads(shown.output)["values"]
    assert values["state_dir"] == str(here / "mine" / ".headwater")
    assert values["lake"] == str(here / "mine" / ".headwater" / "lake")
    applied = runner.invoke(main, ["--repo", str(here / "mine"), "apply", "--no-feast"])
    assert applied.exit_code == 0, applied.output
    plans = sorted(p.name for p in (here / "mine" / ".headwater" / "plans").iterdir())
    assert plans == ["nearline.json", "offline.json", "realtime.json"]
    assert not (here / ".headwater").exists()  # nothing beside the working folder


def test_cli_reports_a_broken_config_before_any_work(here: Path) -> None:
    from headwater.cli.main import main

    path = write(here, "stat_dir: x\n")
    result = CliRunner().invoke(main, ["check"])
    assert result.exit_code == 1
    assert f"{path}:1: unknown key 'stat_dir'" in result.output


def test_the_checkout_is_a_feature_repo_with_the_template_config() -> None:
    root = checkout_root()
    assert root is not None  # the tests run from a source checkout
    text = (root / cfg.CONFIG_FILE).read_text(encoding="utf-8")
    assert text == TEMPLATE.format(kafka="127.0.0.1:9092", redis="redis://127.0.0.1:6379/0")
    assert cfg.load_config(root / cfg.CONFIG_FILE).config == cfg.RepoConfig()  # the defaults, spelled out


def test_jars_come_from_the_resolved_folder_or_say_how_to_get_them(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from headwater.pipelines import jvm

    write(here, "jvm_lib: jars\n")
    (here / "jars" / "delta").mkdir(parents=True)
    (here / "jars" / "delta" / "d.jar").write_bytes(b"")
    assert jvm.jars("delta") == [here / "jars" / "delta" / "d.jar"]
    monkeypatch.setenv("HEADWATER_JVM_LIB", str(here / "empty"))
    with pytest.raises(jvm.MissingJarsError, match=r"empty/flink for 'flink': run `headwater setup jars`"):
        jvm.jars("flink")


def test_redis_eviction_is_refused_by_default_and_declared_with_its_line(here: Path) -> None:
    assert cfg.resolve().redis_eviction == "refuse"
    write(here, "version: 1\nredis:\n  url: redis://127.0.0.1:6379/0\n  eviction: allow\n")
    found = cfg.resolve()
    assert found.redis_eviction == "allow"
    assert found.origins["redis.eviction"].endswith("headwater.yaml:4")


def test_an_unknown_redis_eviction_names_the_line_and_the_choices(here: Path) -> None:
    write(here, "version: 1\nredis:\n  eviction: sometimes\n")
    with pytest.raises(cfg.ConfigError, match=r"headwater.yaml:3.*redis.eviction.*'refuse' or 'allow'"):
        cfg.resolve()
