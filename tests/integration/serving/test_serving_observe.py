"""Issue 20 against a real `headwater serve`, Redis, Kafka and Spark: experiments, business metrics,
the experiment report from landed events, and record-and-replay.

One service runs for the module: features/ applied, two models trained (the control's and the
treatment's), an experiment of three arms (control, treatment with its own model, and an arm that
starts the chain at popularity), recording every request, impressions and feedback to a fresh topic.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import NewTopic

from headwater.cli.experiment import report as report_command
from headwater.pipelines.events.codec import DecodedEvent, EventCodec
from headwater.pipelines.offline.landing import Lander, LandingConfig
from headwater.pipelines.offline.testing import behaviour
from headwater.ranking.experiment_stats import RatioMoments, ratio_interval, sample_ratio_test
from headwater.ranking.features import load_registry
from headwater.ranking.synthetic import make_world, training_set, write_world
from headwater.ranking.trainset import write_parquet
from headwater.serving.config import DEFAULT_POPULARITY
from headwater.serving.experiments import ArmConfig, Assigner, ExperimentConfig
from headwater.serving.recording import read_records, read_topic_records
from headwater.serving.store import OnlineStoreReader, now_ms

ROOT = Path(__file__).resolve().parents[3]
HEADWATER = str(Path(sys.executable).with_name("headwater"))
USERS, ITEMS, K = 300, 60, 5
EXPERIMENT = ExperimentConfig(
    name="ranker-v2",
    arms=(
        ArmConfig(name="control", weight=50),
        ArmConfig(name="treatment", weight=30, model=Path("set-by-the-fixture")),
        ArmConfig(name="popular", weight=20, start_at="popularity"),
    ),
)
ASSIGNER = Assigner(EXPERIMENT)


_spec = importlib.util.spec_from_file_location("edge_service", Path(__file__).with_name("edge_service.py"))
assert _spec is not None
assert _spec.loader is not None
edge = sys.modules.setdefault("edge_service", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(edge)


def _call(url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            raw, status = answer.read(), answer.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


def _train(tmp: Path, out: str, seed: int) -> None:
    cmd = [HEADWATER, "model", "train", "--training-set", str(tmp / "train.parquet"), "--out", str(tmp / out),
           "--epochs", "1", "--seed", str(seed), "--device", "cpu"]  # fmt: skip
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, redis_url: str, kafka_bootstrap: str) -> Iterator[Any]:
    tmp = tmp_path_factory.mktemp("observe")
    state = tmp / "state"
    cmd = [HEADWATER, "apply", str(ROOT / "features"), "--state-dir", str(state), "--no-feast"]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
    registry = load_registry(state, DEFAULT_POPULARITY)
    world = make_world(registry, users=USERS, items=ITEMS, seed=5, empty_share=0.0)
    write_parquet(training_set(registry, world, slates=400, seed=5), tmp / "train.parquet")
    _train(tmp, "models", 0)
    _train(tmp, "models-v2", 1)
    namespace = f"t{uuid.uuid4().hex[:8]}"
    reader = OnlineStoreReader.from_url(redis_url, namespace=namespace)
    write_world(reader, registry, world, now_ms())
    topic = f"test.observe.{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    admin.create_topics([NewTopic(topic, 1, 1), NewTopic(f"{topic}.dlq", 1, 1)])
    recording = tmp / "rec" / "requests.jsonl"
    arms = list(EXPERIMENT.arms)
    arms[1] = arms[1].model_copy(update={"model": tmp / "models-v2"})
    config = {
        "experiment": EXPERIMENT.model_copy(update={"arms": tuple(arms)}).model_dump(mode="json"),
        "recording": {"enabled": True, "path": str(recording), "sample_rate": 1.0, "topic": f"{topic}.rec"},
        "default_deadline_ms": 5000.0,  # under load the DCN must answer: the test checks each arm's model
    }
    (tmp / "serving.yaml").write_text(json.dumps(config))  # JSON is YAML
    args = ["--model", str(tmp / "models"), "--state-dir", str(state), "--namespace", namespace,
            "--feedback-topic", topic, "--device", "cpu", "--config", str(tmp / "serving.yaml")]  # fmt: skip
    try:
        with edge.serve_process(tmp, *args) as service:
            yield {"url": service.url, "world": world, "topic": topic, "tmp": tmp, "state": state,
                   "reader": reader, "registry": registry, "recording": recording, "answers": {},
                   "clicks": Counter(), "clickers": {}}  # fmt: skip
    finally:
        admin.delete_topics([topic, f"{topic}.dlq", f"{topic}.rec"])
        admin.close()
        edge.drop_namespace(redis_url, namespace)
        reader.close()


def _metric(text: str, name: str, labels: dict[str, str]) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_arms_score_with_their_models_and_travel_with_the_events(served: Any, kafka_bootstrap: str) -> None:
    world, url = served["world"], served["url"]
    versions: dict[str, set[Any]] = {}
    for n, user in enumerate(world.user_ids):
        candidates = world.item_ids[(n % 3) * 10 : (n % 3) * 10 + 20]
        body = {"user_id": user, "candidates": candidates, "k": K, "session_id": f"s-{user}"}
        status, answer = _call(f"{url}/v1/rank", body)
        assert status == 200, answer
        arm = ASSIGNER.arm(user)
        assert answer["arm"] == f"ranker-v2/{arm}"
        versions.setdefault(arm, set()).add(
            (answer["model_version"], answer["fallback"], answer["fallback_reason"])
        )
        served["answers"][user] = answer
        if n % 4 == 0:  # a quarter of the users click their first item
            click = {"user_id": user, "item_id": answer["items"][0]["item_id"], "event_type": "click",
                     "request_id": answer["request_id"], "position": 1}  # fmt: skip
            assert _call(f"{url}/v1/feedback", click)[0] == 202
            served["clicks"][arm] += 1
            served["clickers"][user] = 1
    (control,), (treatment,), (popular,) = versions["control"], versions["treatment"], versions["popular"]
    assert control[1:] == (None, None)
    assert treatment[1:] == (None, None)
    assert control[0] != treatment[0]  # the treatment arm scores with its own model
    assert popular == (None, "popularity", "experiment")

    # Kafka: every impression and click carries its user's arm.
    expected = USERS * K + sum(served["clicks"].values())
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, consumer_timeout_ms=2000)
    part = TopicPartition(served["topic"], 0)
    consumer.assign([part])
    consumer.seek_to_beginning(part)
    codec, events = EventCodec(), []
    deadline = time.monotonic() + 60
    while len(events) < expected and time.monotonic() < deadline:
        for record in consumer.poll(timeout_ms=1000).get(part, []):
            decoded = codec.decode(record.value, record.headers)
            assert isinstance(decoded, DecodedEvent), decoded
            events.append(decoded.event)
    consumer.close()
    assert len(events) == expected
    assert all(e["arm"] == ASSIGNER.label(e["user_id"]) for e in events)
    kinds = Counter((e["arm"], e["event_type"]) for e in events)
    arms = Counter(ASSIGNER.arm(u) for u in world.user_ids)
    for arm, users in arms.items():
        assert kinds[(f"ranker-v2/{arm}", "impression")] == users * K
        assert kinds[(f"ranker-v2/{arm}", "click")] == served["clicks"][arm]

    # /metrics: the same counts per model version, arm and fallback.
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    for arm, (version, fallback, _) in (("control", control), ("treatment", treatment), ("popular", popular)):
        labels = {
            "model_version": version or "none",
            "arm": f"ranker-v2/{arm}",
            "fallback": fallback or "none",
        }
        assert _metric(text, "headwater_impressions_total", labels) == arms[arm] * K
        assert _metric(text, "headwater_clicks_total", labels) == served["clicks"][arm]


def test_experiment_report_from_the_landed_events(served: Any, spark: Any, kafka_bootstrap: str) -> None:
    assert served["answers"], "runs after the ranking test"
    tmp, topic = served["tmp"], served["topic"]
    lake = tmp / "lake"
    source = behaviour().model_copy(update={"topic": topic})
    config = LandingConfig(kafka_bootstrap, source, f"{topic}.dlq", lake / "bronze" / "events")
    stats = Lander(spark, config).run()
    assert stats.landed == USERS * K + sum(served["clicks"].values())
    # In this process: the command's Spark session is the fixture's (a new JVM took over 300 s at load 58).
    args = ["--config", str(tmp / "serving.yaml"), "--state-dir", str(served["state"]), "--lake", str(lake),
            "--format", "json"]  # fmt: skip
    done = CliRunner().invoke(report_command, args)
    assert done.exit_code in (0, 1), done.output[-3000:]
    report = json.loads(done.stdout)
    arms = Counter(ASSIGNER.arm(u) for u in served["world"].user_ids)
    got = {a["arm"]: a for a in report["arms"]}
    assert set(got) == {"control", "treatment", "popular"}
    for arm, users in arms.items():
        clicks = served["clicks"][arm]
        line = got[arm]
        assert (line["users"], line["impressions"], line["clicks"]) == (users, users * K, clicks)
        assert line["ctr"] == pytest.approx(clicks / (users * K))
        # The interval's unit is the user: K impressions each, a click by a quarter of them.
        per_user = [(float(served["clickers"].get(u, 0)), float(K)) for u in served["world"].user_ids
                    if ASSIGNER.arm(u) == arm]  # fmt: skip
        expected = ratio_interval(RatioMoments.of(per_user))
        assert (line["ctr_low"], line["ctr_high"]) == pytest.approx(expected)
    srm = sample_ratio_test(dict(arms), {"control": 50, "treatment": 30, "popular": 20})
    assert report["srm"]["p_value"] == pytest.approx(srm.p_value)
    assert report["srm"]["flagged"] is srm.flagged
    assert done.exit_code == (1 if srm.flagged else 0)


def test_replay_reports_no_change_then_the_changed_share(served: Any, kafka_bootstrap: str) -> None:
    assert served["answers"], "runs after the ranking test"
    records = read_records([served["recording"]])
    assert len(records) == USERS  # every rank request; the invalid or feedback posts are not recorded
    assert [r.items for r in records] == [
        [x["item_id"] for x in served["answers"][r.request["user_id"]]["items"]] for r in records
    ]
    # The same records went to the recording topic as well.
    sent = read_topic_records(kafka_bootstrap, f"{served['topic']}.rec")
    key = lambda r: (r.at_ms, r.request["user_id"])  # noqa: E731
    assert [(r.at_ms, r.request, r.status, r.items) for r in sorted(sent, key=key)] == [
        (r.at_ms, r.request, r.status, r.items) for r in sorted(records, key=key)
    ]
    cmd = [HEADWATER, "replay", str(served["recording"]), "--url", served["url"], "--speed", "4",
           "--format", "json"]  # fmt: skip
    from_topic = [HEADWATER, "replay", "--topic", f"{served['topic']}.rec", "--bootstrap", kafka_bootstrap,
                  "--url", served["url"], "--speed", "4", "--format", "json"]  # fmt: skip
    first = json.loads(
        subprocess.run(from_topic, cwd=ROOT, capture_output=True, text=True, check=True, timeout=300).stdout
    )
    assert (first["requests"], first["error_count"], first["compared"]) == (USERS, 0, USERS)
    assert first["changed"] == 0
    assert first["latency_ms"]["p50"] is not None
    assert first["latency_ms"]["p99"] >= first["latency_ms"]["p50"]
    assert first["fallbacks"] == first["recorded_fallbacks"]

    # New feature values for every user and item: the answers change, and --max-changed gates on it.
    other = make_world(served["registry"], users=USERS, items=ITEMS, seed=99, empty_share=0.0)
    write_world(served["reader"], served["registry"], other, now_ms())
    gated = subprocess.run(
        [*cmd, "--max-changed", "0.05"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert gated.returncode == 1, gated.stderr
    assert "of the answers changed; the limit is 5.00%" in gated.stderr
    second = json.loads(gated.stdout)
    assert second["error_count"] == 0
    assert second["changed_share"] > 0.5
