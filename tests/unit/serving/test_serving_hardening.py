"""The service never answers 500 (issue 16 item 2), in-process with fake stores.

- a Redis reply that breaks the protocol, and any other exception out of a store read, fall back;
- a body over the limit is refused (413) however it is framed (chunked included);
- store reads are bounded: past the bound a read fails at once and the request falls back;
- a broken ``latest.json`` or incomplete model metadata degrades start-up to linear or popularity.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from headwater.pipelines.store import ViewLayout
from headwater.ranking.artifact import LATEST, save_artifact
from headwater.ranking.model import DCNRanker
from headwater.ranking.synthetic import small_registry
from headwater.serving.app import create_app
from headwater.serving.config import ServingConfig
from headwater.serving.runtime import LoadedModels, load_models
from headwater.serving.store import (
    FeatureReadError,
    InMemoryFeatureStore,
    OnlineStoreReader,
    ReadPool,
    ViewRows,
)

REGISTRY = small_registry({"u": ["a", "b"]}, {"i": ["x"]}, "i.x", registry_hash="sha256:" + "12" * 32)
U, ITEM = REGISTRY.user.layouts[0], REGISTRY.item.layouts[0]
CONFIG = ServingConfig(editorial_items=("i2",), item_cache_ttl_s=0.0, io_threads=2)
BODY = {"user_id": "u1", "candidates": ["i0", "i1", "i2"], "k": 2, "log_impressions": False}
NO_MODELS = LoadedModels(None, None, None, None, "cpu")


def client(reader: Any, config: ServingConfig = CONFIG) -> TestClient:
    # raise_server_exceptions=False: the client sees what a real one would, a 500 included.
    return TestClient(create_app(config, REGISTRY, reader, NO_MODELS), raise_server_exceptions=False)


# --- a Redis protocol error -----------------------------------------------------------------------


@pytest.fixture
def not_redis() -> Iterator[str]:
    """A TCP server that answers every command with a line that is not RESP."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                try:
                    while conn.recv(65536):
                        conn.sendall(b"?this is not redis\r\n")
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"redis://127.0.0.1:{server.getsockname()[1]}/0"
    stop.set()
    thread.join()
    server.close()


def test_a_protocol_error_is_a_feature_read_error(not_redis: str) -> None:
    reader = OnlineStoreReader.from_url(not_redis, timeout_s=2.0)
    with pytest.raises(FeatureReadError, match=r"InvalidResponse: Protocol error.*points at a Redis server"):
        reader.read_many([(U, ["u1"])])
    reader.close()


def test_a_protocol_error_falls_back_instead_of_a_500(not_redis: str) -> None:
    reader = OnlineStoreReader.from_url(not_redis, timeout_s=2.0)
    with client(reader) as c:
        response = c.post("/v1/rank", json=BODY)
    reader.close()
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["fallback"], body["fallback_reason"]) == ("editorial", "store_error")
    assert [i["item_id"] for i in body["items"]] == ["i2", "i0"]


class BrokenReader:
    """A reader with a bug: raises what no step of the chain expects."""

    def read_many(self, requests: Sequence[tuple[ViewLayout, Sequence[str]]]) -> list[ViewRows]:
        msg = "operands could not be broadcast together"
        raise ValueError(msg)

    def other_version_rows(self) -> dict[str, int]:
        return {}


def test_an_unexpected_exception_answers_the_editorial_list() -> None:
    with client(BrokenReader()) as c:
        response = c.post("/v1/rank", json=BODY)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["fallback"], body["fallback_reason"]) == ("editorial", "internal_error")
    assert [i["item_id"] for i in body["items"]] == ["i2", "i0"]


def test_an_online_store_bug_is_a_feature_read_error() -> None:
    class Store:
        def read_many(self, requests: object) -> object:
            raise IndexError("tuple index out of range")

    with pytest.raises(FeatureReadError, match="IndexError: tuple index out of range"):
        OnlineStoreReader(Store()).read_many([(U, ["u1"])])  # type: ignore[arg-type]


# --- the body limit -------------------------------------------------------------------------------

LIMIT = 2048


def chunks(data: bytes, size: int = 500) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def test_a_chunked_body_over_the_limit_is_refused() -> None:
    big = json.dumps({**BODY, "candidates": [f"item-{i:05d}" for i in range(400)]}).encode()
    assert len(big) > LIMIT
    with client(InMemoryFeatureStore(), ServingConfig(max_body_bytes=LIMIT)) as c:
        response = c.post("/v1/rank", content=chunks(big), headers={"content-type": "application/json"})
    assert response.status_code == 413, response.text
    assert response.json()["detail"].startswith(f"the request body is over the limit of {LIMIT} bytes (")


def test_a_chunked_body_under_the_limit_is_served() -> None:
    small = json.dumps(BODY).encode()
    with client(InMemoryFeatureStore(), ServingConfig(max_body_bytes=LIMIT)) as c:
        response = c.post("/v1/rank", content=chunks(small, 7), headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    assert response.json()["fallback"] == "editorial"


def test_a_content_length_over_the_limit_is_refused_before_reading() -> None:
    big = b"x" * (LIMIT + 1)
    with client(InMemoryFeatureStore(), ServingConfig(max_body_bytes=LIMIT)) as c:
        response = c.post("/v1/rank", content=big, headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert response.json()["detail"] == f"the request body is {LIMIT + 1} bytes; the limit is {LIMIT}"


# --- bounded store reads --------------------------------------------------------------------------


class HungReader:
    """Every read blocks until ``release``; counts the reads that reached it."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = 0
        self._lock = threading.Lock()

    def read_many(self, requests: Sequence[tuple[ViewLayout, Sequence[str]]]) -> list[ViewRows]:
        with self._lock:
            self.started += 1
        self.release.wait(30)
        return InMemoryFeatureStore().read_many(requests)

    def other_version_rows(self) -> dict[str, int]:
        return {}


def test_the_default_bound_takes_a_burst() -> None:
    assert ReadPool(4).max_in_flight == 64  # the default 4 I/O threads
    assert ReadPool(8).max_in_flight == 128


def test_read_pool_refuses_past_its_bound_and_counts_until_the_thread_returns() -> None:
    pool = ReadPool(threads=2, max_in_flight=3)
    gate = threading.Event()
    futures: list[Future[bool]] = [pool.submit(gate.wait, 30) for _ in range(3)]
    with pytest.raises(FeatureReadError, match="3 online-store reads are already in flight on 2 threads"):
        pool.submit(gate.wait, 30)
    assert (pool.in_flight, pool.refused) == (3, 1)
    assert futures[2].cancel()  # queued, never started: cancelling frees its place
    assert pool.in_flight == 2
    gate.set()
    assert [f.result(5) for f in futures[:2]] == [True, True]
    deadline = time.monotonic() + 5
    while pool.in_flight and time.monotonic() < deadline:  # done callbacks run on the pool's threads
        time.sleep(0.01)
    assert pool.in_flight == 0
    pool.shutdown()
    assert pool.submit(sum, [1, 2]).result(5) == 3  # an app served again after its lifespan ended
    pool.shutdown()


def test_the_app_serves_through_a_second_lifespan() -> None:
    store = InMemoryFeatureStore()
    store.write(
        ITEM, ["i0", "i1", "i2"], np.array([[1.0], [3.0], [2.0]], np.float32), int(time.time() * 1000)
    )
    app = create_app(CONFIG, REGISTRY, store, NO_MODELS)
    for _ in range(2):
        with TestClient(app) as c:
            body = c.post("/v1/rank", json=BODY).json()
        assert (body["fallback"], [i["item_id"] for i in body["items"]]) == ("popularity", ["i1", "i2"])


def test_a_hung_store_holds_at_most_the_bound_and_requests_fall_back() -> None:
    reader = HungReader()
    app = create_app(CONFIG, REGISTRY, reader, NO_MODELS, max_reads_in_flight=4)  # type: ignore[arg-type]
    with TestClient(app, raise_server_exceptions=False) as c, ThreadPoolExecutor(12) as callers:
        # A long deadline: the first reads stay in flight while the other requests arrive.
        sent = [callers.submit(c.post, "/v1/rank", json={**BODY, "deadline_ms": 5000}) for _ in range(12)]
        answers = [f.result(60) for f in sent]
        reads = app.state.reads
        assert {(r.status_code, r.json()["fallback_reason"]) for r in answers} == {(200, "store_error")}
        # 4 reads in flight at most: 2 hung in the store (2 threads), 2 queued behind them.
        assert reader.started == 2
        assert reads.in_flight <= 4
        # 12 feature reads and 12 popularity reads asked for; at most 4 were ever accepted at once
        # and each accepted read holds its place until its caller's deadline.
        assert reads.refused >= 12 - 4
        reader.release.set()


# --- start-up degrades --------------------------------------------------------------------------


def _save_models(out: Path) -> tuple[str, str]:
    """A DCN and its linear sibling bound to REGISTRY (2 user slots, 1 item slot), and latest.json."""
    meta = {"user_features": ["a", "b"], "item_features": ["x"], "registry_version": "1212121212121212"}
    linear_state = {
        "user_mean": torch.zeros(2), "user_scale": torch.ones(2), "item_mean": torch.zeros(1),
        "item_scale": torch.ones(1), "w_user": torch.zeros(2), "w_item": torch.ones(1),
        "w_cross": torch.zeros(2, 1), "bias": torch.zeros(1),
    }  # fmt: skip
    linear = save_artifact(out, {**meta, "kind": "linear"}, linear_state)
    torch.manual_seed(0)
    dcn = DCNRanker(2, 1, embed_dim=3, cross_layers=2, deep=(8, 4))
    hyper = {"embed_dim": 3, "cross_layers": 2, "deep": [8, 4]}
    neural = save_artifact(
        out,
        {**meta, "kind": "dcn", "hyperparameters": hyper, "linear_artifact": linear.path.name},
        dcn.state_dict(),
    )
    (out / LATEST).write_text(json.dumps({"dcn": neural.path.name, "linear": linear.path.name}))
    return neural.version, linear.version


def test_good_models_load(tmp_path: Path) -> None:
    neural, linear = _save_models(tmp_path)
    loaded = load_models(tmp_path, REGISTRY, "cpu")
    assert (loaded.models().neural_version, loaded.models().linear_version) == (neural, linear)


@pytest.mark.parametrize(
    "pointer",
    ['{"dcn": "dcn-', '"dcn-abc.pt"', "[]", '{"dcn": 7}', b"\xff\xfe{}"],
    ids=["truncated", "a-string", "a-list", "not-a-name", "not-utf8"],
)
def test_a_broken_latest_json_degrades_to_popularity(tmp_path: Path, pointer: str | bytes) -> None:
    _save_models(tmp_path)
    path = tmp_path / LATEST
    path.write_bytes(pointer if isinstance(pointer, bytes) else pointer.encode())
    loaded = load_models(tmp_path, REGISTRY, "cpu")
    assert (loaded.neural, loaded.linear) == (None, None)
    app = create_app(CONFIG, REGISTRY, InMemoryFeatureStore(), loaded)
    with TestClient(app) as c:
        health = c.get("/health").json()
    assert (health["status"], health["model_version"], health["linear_version"]) == ("degraded", None, None)


def test_latest_json_without_the_dcn_degrades_to_its_linear(tmp_path: Path) -> None:
    _, linear = _save_models(tmp_path)
    path = tmp_path / LATEST
    path.write_text(json.dumps({"linear": json.loads(path.read_text())["linear"]}))
    loaded = load_models(tmp_path, REGISTRY, "cpu")
    assert loaded.neural is None
    assert loaded.models().linear_version == linear


def test_a_dcn_without_slot_metadata_degrades_to_the_linear(tmp_path: Path) -> None:
    _, linear = _save_models(tmp_path)
    dcn_name = json.loads((tmp_path / LATEST).read_text())["dcn"]
    raw = torch.load(tmp_path / dcn_name, weights_only=True)
    meta = json.loads(raw["metadata_json"])
    del meta["user_features"]
    state = raw["state"]
    resaved = save_artifact(tmp_path, meta, state)  # a consistent hash over the incomplete metadata
    (tmp_path / LATEST).write_text(json.dumps({"dcn": resaved.path.name, "linear": "ignored.pt"}))
    loaded = load_models(tmp_path, REGISTRY, "cpu")
    assert loaded.neural is None
    assert loaded.models().linear_version == linear  # found through the dcn's own metadata


@pytest.mark.parametrize("drop", ["metadata_json", "state"])
def test_an_artifact_missing_a_part_degrades(tmp_path: Path, drop: str) -> None:
    _save_models(tmp_path)
    dcn_name = json.loads((tmp_path / LATEST).read_text())["dcn"]
    raw = torch.load(tmp_path / dcn_name, weights_only=True)
    del raw[drop]
    torch.save(raw, tmp_path / dcn_name)
    loaded = load_models(tmp_path, REGISTRY, "cpu")
    assert loaded.neural is None
    assert loaded.linear is not None  # latest.json still names the linear model


def test_a_linear_with_wrong_shapes_degrades_to_popularity(tmp_path: Path) -> None:
    out = tmp_path / "m"
    meta = {"user_features": ["a", "b"], "item_features": ["x"], "kind": "linear"}
    bad = {
        k: torch.zeros(3) for k in ("user_mean", "user_scale", "item_mean", "item_scale", "w_user", "w_item")
    }
    linear = save_artifact(out, meta, {**bad, "w_cross": torch.zeros(3, 3), "bias": torch.zeros(1)})
    (out / LATEST).write_text(json.dumps({"dcn": "missing.pt", "linear": linear.path.name}))
    loaded = load_models(out, REGISTRY, "cpu")
    assert (loaded.neural, loaded.linear) == (None, None)


def test_a_degraded_service_still_ranks(tmp_path: Path) -> None:
    store = InMemoryFeatureStore()
    store.write(
        ITEM, ["i0", "i1", "i2"], np.array([[1.0], [3.0], [2.0]], np.float32), int(time.time() * 1000)
    )
    with client(store) as c:
        body = c.post("/v1/rank", json=BODY).json()
    assert body["fallback"] == "popularity"
    assert [i["item_id"] for i in body["items"]] == ["i1", "i2"]
