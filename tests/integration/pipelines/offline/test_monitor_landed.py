"""``headwater monitor`` on a landed prediction log (Delta, read with Spark): the thin path end to end.

Two days of prediction records are appended to ``<lake>/predictions/<topic>`` the way ``headwater
skew`` lands them; the second day's ``user.a`` values are shifted. The command reads the table,
names the values by the trained model's slots and reports the drift against the day before; the
feature repo's ``expect`` block on ``a`` makes it a breach.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from click.testing import CliRunner

from headwater.cli.monitor import monitor_command
from headwater.pipelines.offline.skew_land import _append, predictions_path, row_of
from headwater.ranking.monitor import model_slots
from headwater.ranking.synthetic import make_world, small_registry, training_set
from headwater.ranking.train import TrainOptions, train_and_save
from headwater.registry.testing import MINIMAL_VIEW, ScratchRepo

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parents[4]
REGISTRY = small_registry({"u": ["a", "b"]}, {"i": ["x"], "p": ["clicks"]}, "p.clicks")
DEC_4 = 1_796_342_400_000  # 2026-12-04T00:00:00Z
DAY_MS = 86_400_000
# A user view whose feature `a` is the model's first user slot, with a drift limit.
VIEW = MINIMAL_VIEW.replace("name: clicks_30s", "name: a").replace(
    "    window: 30s", "    window: 30s\n    expect: {max_drift_psi: 0.5}"
)


def _record(n: int, at_ms: int, version: str, user: list[float]) -> bytes:
    record = {
        "v": 2,
        "request_id": f"r{n}",
        "at_ms": at_ms,
        "user_id": f"u{n % 7}",
        "model_version": version,
        "views": {"u": {"side": "user", "version": "vu", "event_ms": at_ms - 1000}},
        "item_views": [],
        "user": user,
        "items": ["i1", "i2"],
        "item_features": [[1.0, 2.0], [3.0, 4.0]],
        "found": [True, True],
        "scores": [0.5, 0.25],
    }
    return json.dumps(record).encode()


def test_monitor_reads_the_landed_log_and_names_the_drift(spark: SparkSession, tmp_path: Path) -> None:
    world = make_world(REGISTRY, users=20, items=20, seed=2, empty_share=0.0)
    train_and_save(
        training_set(REGISTRY, world, slates=20, seed=2),
        tmp_path / "models",
        TrainOptions(epochs=1, device="cpu"),
    )
    slots, notes = model_slots(tmp_path / "models")
    assert notes == []
    version = sorted(slots)[0]
    assert slots[version] == (("a", "b"), ("x", "clicks"))
    lake = tmp_path / "lake"
    rows = [row_of(0, n, _record(n, DEC_4 - DAY_MS + n, version, [float(n % 10), 1.0])) for n in range(100)]
    rows += [row_of(0, 100 + n, _record(n, DEC_4 + n, version, [float(n % 10) + 5, 1.0])) for n in range(100)]
    _append(spark, rows, predictions_path(lake, "preds"), lake)
    repo = ScratchRepo(tmp_path / "features", template=ROOT / "features")
    repo.write("v1.yaml", VIEW)
    args = ["--lake", str(lake), "--topic", "preds", "--models", str(tmp_path / "models"),
            "--features", str(repo.root), "--format", "json"]  # fmt: skip
    result = CliRunner().invoke(monitor_command, args)
    assert result.exit_code == 1, result.output
    doc = json.loads(result.output)
    assert doc["day"] == "2026-12-04"
    got = [(b["column"], b["check"], b["against"]) for b in doc["breaches"]]
    assert got == [("user.a", "max_drift_psi", "previous day")]
    columns = {c["column"]: c for c in doc["columns"]}
    assert columns["user.a"]["served"]["mean"] == 9.5
    assert columns["user.a"]["previous_day"]["mean"] == 4.5
    assert columns["user.b"]["drift_vs_previous_day"]["psi"] == 0.0
    assert columns["item.x"]["served"]["count"] == 200  # two found items an answer, this day's 100
    assert columns["item.x"]["served"]["mean"] == 2.0
