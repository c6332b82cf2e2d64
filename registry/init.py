"""``headwater init DIR``: a new feature repo, the example definitions and one config file.

The repo is ``DIR/headwater.yaml`` (where Kafka, Redis, the state folder and the lake are) and
``DIR/features/`` (a copy of the example repo shipped with headwater: entities, sources, budget,
one view per tier and source, the Avro schemas), ready for ``headwater check`` and ``apply``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from headwater.registry import resources
from headwater.registry.config import (
    CONFIG_FILE,
    DEFAULT_FEATURES,
    DEFAULT_STATE_DIR,
    KafkaConfig,
    RedisConfig,
    load_config,
)
from headwater.registry.errors import HeadwaterError

TEMPLATE = """\
# headwater.yaml: where this feature repo's platform is (what feature_store.yaml is to Feast).
# Relative paths resolve against this file's folder. HEADWATER_* environment variables override
# a value here (HEADWATER_STATE_DIR, HEADWATER_LAKE, HEADWATER_KAFKA_BOOTSTRAP, HEADWATER_REDIS_URL,
# HEADWATER_JVM_LIB); command-line options override both.
version: 1
features: features         # entities.yaml, sources.yaml, budget.yaml, one file per view, schemas/
state_dir: .headwater      # what `apply` and the tiers write: plans, checkpoints, stores, models
# lake: /data/lake         # the offline tier's Delta tables [default: lake/ in the state folder]
kafka:
  bootstrap: {kafka}
  dlq_topic: events.dlq    # dead letters of every source (invalid, late, future-dated), with reasons
  partitions: 4            # of the topics `headwater topics create` makes
redis:
  url: {redis}
# jvm_lib: /opt/jars       # the tiers' jars [default: ~/.cache/headwater/lib, which
#                          # `headwater setup jars` fills; in a source checkout infra/lib]
"""

GITIGNORE = f"# written by `headwater apply` and the tiers\n{DEFAULT_STATE_DIR}/\n"


class InitError(HeadwaterError):
    """The target already holds a feature repo (nothing is overwritten)."""


def scaffold(target: Path, kafka: str, redis: str) -> Path:
    """Create the feature repo at ``target`` and return its config file.

    Raises:
        InitError: ``target`` already has a ``headwater.yaml`` or a non-empty ``features/``.
    """
    config = target / CONFIG_FILE
    features = target / DEFAULT_FEATURES
    if config.exists():
        msg = f"{config} already exists: {target} is a feature repo already (nothing was changed)"
        raise InitError(msg)
    if features.exists() and any(features.iterdir()):
        msg = f"{features} exists and is not empty: init a new folder, or move it away (nothing was changed)"
        raise InitError(msg)
    # Validated before anything is written, so a bad address leaves no half-made repo.
    KafkaConfig(bootstrap=kafka)
    RedisConfig(url=redis)
    target.mkdir(parents=True, exist_ok=True)
    shutil.copytree(
        resources.example_features(),
        features,
        dirs_exist_ok=True,
        ignore=shutil.ignore_patterns(".*", "__pycache__"),
    )
    config.write_text(
        TEMPLATE.format(kafka=kafka, redis=redis),
        encoding="utf-8",
    )
    ignore = target / ".gitignore"
    if not ignore.exists():
        ignore.write_text(GITIGNORE, encoding="utf-8")
    load_config(config)  # the file written must read back: a template error fails here, not later
    return config
