"""``headwater ingest push`` against an in-process push API (uvicorn over the memory sink); option errors."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from click.testing import CliRunner

from headwater.cli.main import main
from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.events.sources import example_sources
from headwater.registry.plans import build_plans, plan_path, registry_hash
from headwater.registry.validate import check_repo
from headwater.serving.ingest.core import IngestService
from headwater.serving.ingest.rest import ingest_app
from headwater.serving.ingest.sink import MemorySink

SOURCES = {s.name: s for s in example_sources()}


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from headwater.pipelines.events.schema import example_repo

    folder = tmp_path_factory.mktemp("state")
    result = check_repo(example_repo())
    path = plan_path(folder, "offline")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(build_plans(result, registry_hash(result))["offline"].model_dump_json(), encoding="utf-8")
    return folder


@contextmanager
def _serving(app: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port in a thread; yield its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, MemorySink]]:
    sink = MemorySink()
    with _serving(ingest_app(IngestService(SOURCES, sink))) as url:
        yield url, sink


def test_push_generated_and_file(state: Path, served: tuple[str, MemorySink], tmp_path: Path) -> None:
    url, sink = served
    runner = CliRunner()
    base = ["ingest", "push", "--state-dir", str(state), "--source", "payments", "--url", url]
    done = runner.invoke(main, [*base, "--max-events", "40", "--duration", "30"])
    assert done.exit_code == 0, done.output
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert (counts["accepted"], counts["rejected"]) == (40, 0)
    codec = EventCodec(SOURCES["payments"])
    ids = {codec.decode(r[1], r[3]).event["payment_id"] for r in sink.records}  # type: ignore[union-attr]
    assert len(ids) == 40

    rows = tmp_path / "p.jsonl"
    good = {"payment_id": "f1", "account_id": "a", "merchant_id": "m", "method": "card", "status": "captured",
            "amount": 1.0, "currency": "EUR", "occurred_at": "2026-01-01T00:00:00Z"}  # fmt: skip
    rows.write_text(json.dumps(good) + "\n" + json.dumps({**good, "payment_id": "f2", "amount": -1}) + "\n")
    done = runner.invoke(main, [*base, "--from", str(rows)])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout.strip().splitlines()[-1])["rejected"] == 1
    assert "rejected: amount: rule 'amount >= 0'" in done.stderr


def test_option_errors(state: Path) -> None:
    runner = CliRunner()
    done = runner.invoke(main, ["ingest", "serve", "--state-dir", str(state), "--feast-push", "nope"])
    assert done.exit_code == 2
    assert "expected PUSH_SOURCE=SOURCE" in done.output
    done = runner.invoke(main, ["ingest", "push", "--state-dir", str(state), "--source", "nope"])
    assert done.exit_code == 1
    assert "not in the applied plan" in done.output


def test_plan_watcher_reads_a_new_apply(state: Path) -> None:
    import os

    from headwater.cli.ingest import PlanWatcher

    watcher = PlanWatcher(state)
    assert "payments" in watcher.sources()
    assert watcher.changed() is None
    stat = watcher.path.stat()
    os.utime(watcher.path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # `headwater apply` again
    again = watcher.changed()
    assert again is not None
    assert set(again) == {"events", "payments"}
    assert watcher.changed() is None


def test_serve_needs_an_auth_choice(state: Path) -> None:
    runner = CliRunner()
    done = runner.invoke(main, ["ingest", "serve", "--state-dir", str(state)])
    assert done.exit_code == 2
    assert "needs an auth choice" in done.output
    done = runner.invoke(
        main, ["ingest", "serve", "--state-dir", str(state), "--no-auth", "--host", "0.0.0.0"]
    )
    assert done.exit_code == 2
    assert "only on a loopback address" in done.output


def test_the_ingest_role_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient

    from headwater.cli.ingest import IngestRole
    from headwater.serving.auth import Authenticator, key_hash, new_api_key
    from headwater.serving.config import AuthConfig

    from ..serving.ingest.test_ingest_core import payment

    pusher, ranker = new_api_key()[0], new_api_key()[0]
    doc = (
        f"keys:\n- id: pusher\n  sha256: {key_hash(pusher)}\n  roles: [ingest]\n"
        f"- id: ranker\n  sha256: {key_hash(ranker)}\n  roles: [rank]\n"
    )
    monkeypatch.setenv("HW_TEST_INGEST_KEYS", doc)
    authorize = IngestRole(Authenticator(AuthConfig(api_keys_env="HW_TEST_INGEST_KEYS")))
    sink = MemorySink()
    http = TestClient(ingest_app(IngestService(SOURCES, sink, authorize=authorize)))
    url = "/v1/sources/payments/events"
    assert http.post(url, json=[payment(1)]).status_code == 401
    assert http.post(url, json=[payment(1)], headers={"authorization": f"Bearer {ranker}"}).status_code == 403
    assert http.get("/v1/sources/payments").status_code == 401
    reply = http.post(url, json=[payment(1)], headers={"authorization": f"Bearer {pusher}"})
    assert reply.status_code == 200, reply.text
    assert len(sink.records) == 1


def test_a_refused_push_is_a_clean_error(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from headwater.cli.ingest import IngestRole
    from headwater.serving.auth import Authenticator, key_hash, new_api_key
    from headwater.serving.config import AuthConfig

    ranker = new_api_key()[0]
    monkeypatch.setenv(
        "HW_TEST_INGEST_KEYS", f"keys:\n- id: ranker\n  sha256: {key_hash(ranker)}\n  roles: [rank]\n"
    )
    authorize = IngestRole(Authenticator(AuthConfig(api_keys_env="HW_TEST_INGEST_KEYS")))
    app = ingest_app(IngestService(SOURCES, MemorySink(), authorize=authorize))
    with _serving(app) as url:
        base = ["ingest", "push", "--state-dir", str(state), "--source", "payments", "--url", url]
        base += ["--max-events", "3"]
        for token, status in (("wrong", 401), (ranker, 403)):
            done = CliRunner().invoke(main, [*base, "--token", token])
            assert done.exit_code == 1
            assert done.exception is None or isinstance(done.exception, SystemExit)  # no traceback
            assert f"Error: the push API at {url} refused the batch: {status}" in done.output
