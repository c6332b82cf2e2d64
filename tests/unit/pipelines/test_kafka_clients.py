"""headwater.pipelines.kafka: the one place Kafka clients are built (options merged, security applied).

The client classes are replaced by recorders, so no broker is needed; the last test walks the code
and fails when a module other than pipelines/kafka.py constructs a Kafka client itself.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import confluent_kafka
import kafka
import pytest

from headwater.pipelines import kafka as kafka_clients
from headwater.pipelines.nearline.fence import TRANSACTION_TIMEOUT_MS, TaskProducer

ROOT = Path(__file__).resolve().parents[3]
LAYERS = ("registry", "pipelines", "ranking", "serving", "cli")
OWNER = ROOT / "pipelines" / "kafka.py"
KAFKA_PYTHON_CLASSES = {"KafkaProducer", "KafkaConsumer", "KafkaAdminClient"}
CONFLUENT_CLASSES = {"Producer", "Consumer", "AdminClient", "SerializingProducer", "DeserializingConsumer"}


class Recorder:
    """Stands in for a client class: keeps the arguments it was built with."""

    built: list[Recorder]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs
        type(self).built.append(self)

    def init_transactions(self) -> None:
        """TaskProducer fences at construction."""


@pytest.fixture
def clients(monkeypatch: pytest.MonkeyPatch) -> dict[str, type[Recorder]]:
    """Replace kafka-python's three client classes and confluent's Producer with recorders."""
    found: dict[str, type[Recorder]] = {}
    for module, name in [
        (kafka, "KafkaProducer"),
        (kafka, "KafkaConsumer"),
        (kafka, "KafkaAdminClient"),
        (confluent_kafka, "Producer"),
    ]:
        cls = type(name, (Recorder,), {"built": []})
        monkeypatch.setattr(module, name, cls)
        found[name] = cls
    return found


def test_the_bootstrap_and_a_client_id_per_role_are_the_defaults(clients: dict[str, type[Recorder]]) -> None:
    kafka_clients.producer("b:1")
    kafka_clients.consumer("b:1")
    kafka_clients.admin("b:1")
    kafka_clients.confluent_producer("b:1")
    assert clients["KafkaProducer"].built[0].kwargs == {
        "bootstrap_servers": "b:1",
        "client_id": "headwater-producer",
    }
    assert clients["KafkaConsumer"].built[0].kwargs == {
        "bootstrap_servers": "b:1",
        "client_id": "headwater-consumer",
    }
    assert clients["KafkaAdminClient"].built[0].kwargs == {
        "bootstrap_servers": "b:1",
        "client_id": "headwater-admin",
    }
    assert clients["Producer"].built[0].args == (
        {"bootstrap.servers": "b:1", "client.id": "headwater-producer"},
    )


def test_the_call_sites_options_are_passed_unchanged_and_win(clients: dict[str, type[Recorder]]) -> None:
    kafka_clients.producer("b:1", client_id="mine", acks=1, enable_idempotence=False, compression_type=None)
    kafka_clients.consumer("b:1", "t1", "t2", group_id=None, isolation_level="read_committed")
    kafka_clients.admin("b:1", client_id="headwater-admin", request_timeout_ms=10_000)
    kafka_clients.confluent_producer("b:1", **{"client.id": "mine", "partitioner": "murmur2_random"})
    assert clients["KafkaProducer"].built[0].kwargs == {
        "bootstrap_servers": "b:1",
        "client_id": "mine",
        "acks": 1,
        "enable_idempotence": False,
        "compression_type": None,
    }
    consumer = clients["KafkaConsumer"].built[0]
    assert consumer.args == ("t1", "t2")
    assert consumer.kwargs["group_id"] is None
    assert consumer.kwargs["isolation_level"] == "read_committed"
    assert clients["KafkaAdminClient"].built[0].kwargs["request_timeout_ms"] == 10_000
    assert clients["Producer"].built[0].args[0] == {
        "bootstrap.servers": "b:1",
        "client.id": "mine",
        "partitioner": "murmur2_random",
    }


def test_the_bootstrap_is_given_once() -> None:
    with pytest.raises(ValueError, match="bootstrap argument"):
        kafka_clients.client_options("producer", "b:1", {"bootstrap_servers": "other:1"})
    with pytest.raises(ValueError, match="bootstrap argument"):
        kafka_clients.confluent_options("b:1", {"bootstrap.servers": "other:1"})


def test_there_are_no_security_settings_yet() -> None:
    assert kafka_clients.security_options() == {}


def test_every_factory_applies_the_security_hook(
    clients: dict[str, type[Recorder]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        kafka_clients, "security_options", lambda: {"security_protocol": "SSL", "ssl_cafile": "/ca.pem"}
    )
    kafka_clients.producer("b:1", acks="all")
    kafka_clients.consumer("b:1", group_id="g")
    kafka_clients.admin("b:1")
    kafka_clients.confluent_producer("b:1", **{"acks": 1})
    for name in ("KafkaProducer", "KafkaConsumer", "KafkaAdminClient"):
        kwargs = clients[name].built[0].kwargs
        assert kwargs["security_protocol"] == "SSL", name
        assert kwargs["ssl_cafile"] == "/ca.pem", name
    config = clients["Producer"].built[0].args[0]
    assert config["security.protocol"] == "SSL"
    assert config["ssl.ca.location"] == "/ca.pem"
    assert config["acks"] == 1


def test_the_nearline_transactional_producer_keeps_its_settings(clients: dict[str, type[Recorder]]) -> None:
    TaskProducer("b:1", "txn-7", "zstd")
    assert clients["KafkaProducer"].built[0].kwargs == {
        "bootstrap_servers": "b:1",
        "client_id": "headwater-producer",
        "transactional_id": "txn-7",
        "transaction_timeout_ms": TRANSACTION_TIMEOUT_MS,
        "acks": "all",
        "linger_ms": 5,
        "batch_size": 512 * 1024,
        "max_request_size": 8 * 1024 * 1024,
        "compression_type": "zstd",
    }


def _direct_constructions(path: Path) -> list[str]:
    """Return ``line: name`` of each Kafka client class called in ``path`` (import aliases followed)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    forbidden = set(KAFKA_PYTHON_CLASSES)
    modules = {"kafka", "confluent_kafka"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            top = node.module.split(".")[0]
            for alias in node.names:
                confluent = top == "confluent_kafka" and alias.name in CONFLUENT_CLASSES
                if (top == "kafka" and alias.name in KAFKA_PYTHON_CLASSES) or confluent:
                    forbidden.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in modules:
                    modules.add(alias.asname or alias.name)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in forbidden:
            found.append(f"{node.lineno}: {func.id}")
        elif isinstance(func, ast.Attribute) and (
            func.attr in KAFKA_PYTHON_CLASSES
            or (func.attr in CONFLUENT_CLASSES and ast.unparse(func.value) in modules)
        ):
            found.append(f"{node.lineno}: {ast.unparse(func)}")
    return found


def test_the_walk_finds_a_direct_construction(tmp_path: Path) -> None:
    code = tmp_path / "rogue.py"
    code.write_text(
        "import confluent_kafka as ck\n"
        "from kafka import KafkaProducer as P\n"
        "def f():\n"
        "    from confluent_kafka import Producer\n"
        "    return P(), ck.Producer({}), Producer({}), kafka.KafkaConsumer()\n"
    )
    assert len(_direct_constructions(code)) == 4


def test_no_module_but_pipelines_kafka_constructs_a_kafka_client() -> None:
    offenders = {
        str(path.relative_to(ROOT)): found
        for layer in LAYERS
        for path in sorted((ROOT / layer).rglob("*.py"))
        if path != OWNER and (found := _direct_constructions(path))
    }
    assert offenders == {}, "build Kafka clients with headwater.pipelines.kafka (producer/consumer/admin)"
