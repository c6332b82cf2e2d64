"""Give `make demo` a clean slate: drop what an earlier demo left in Kafka, Redis and .headwater/.

The demo produces two days of history with past event times; on top of an earlier demo's data the
streaming tiers (whose watermarks have moved on) would reject all of it as late. Only the local
default's own names are touched: the example repo's source topics (`events`, `payments`), the DLQ, the
service's prediction log (`demo.predictions`),
the nearline tier's `headwater-nearline*` topics, Redis keys under the default `hw:` namespace, and
the demo's folders.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import redis
from kafka import KafkaAdminClient

from headwater.pipelines.settings import Settings
from headwater.registry.validate import check_repo

ROOT = Path(__file__).resolve().parents[1]
STATE = ROOT / ".headwater"
FOLDERS = ("lake", "checkpoints", "nearline", "models", "demo", "plans", "feast", "spark-warehouse")


PREDICTIONS_TOPIC = "demo.predictions"
"""The service's prediction log in the demo (infra/demo/serving.yaml)."""


def main() -> None:
    """Delete the demo's topics, keys and folders, then recreate the topics."""
    settings = Settings.from_env()
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, client_id="headwater-demo-reset")
    names = {settings.dlq_topic, *(src.spec.topic for src in check_repo(ROOT / "features").sources.values())}
    names.add(PREDICTIONS_TOPIC)
    doomed = sorted(t for t in admin.list_topics() if t in names or t.startswith("headwater-nearline"))
    if doomed:
        admin.delete_topics(doomed)
        deadline = time.monotonic() + 60
        while set(doomed) & set(admin.list_topics()) and time.monotonic() < deadline:
            time.sleep(0.5)
    admin.close()
    client = redis.Redis.from_url(settings.redis_url)
    keys = 0
    for key in client.scan_iter(match="hw:*", count=2000):
        keys += client.delete(key)
    for name in FOLDERS:
        shutil.rmtree(STATE / name, ignore_errors=True)
    print(f"removed topics {doomed or 'none'}, {keys} Redis keys, .headwater/{{{','.join(FOLDERS)}}}")
    created = subprocess.run([str(ROOT / ".venv/bin/headwater"), "topics", "create"], check=False)
    sys.exit(created.returncode)


if __name__ == "__main__":
    main()
