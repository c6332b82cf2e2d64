"""latest.json names one artifact per kind; saving one kind leaves the others' entries alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from headwater.ranking.artifact import (
    LATEST,
    ArtifactError,
    point_latest,
    resolve_model_path,
    write_versioned,
)


def test_each_kind_keeps_the_others(tmp_path: Path) -> None:
    (tmp_path / LATEST).write_text(json.dumps({"two_tower": "two_tower-a.pt", "reranker": "reranker-b.pt"}))
    point_latest(tmp_path, "dcn", tmp_path / "dcn-c.pt")
    point_latest(tmp_path, "two_tower", tmp_path / "two_tower-d.pt")
    assert json.loads((tmp_path / LATEST).read_text()) == {
        "two_tower": "two_tower-d.pt",
        "reranker": "reranker-b.pt",
        "dcn": "dcn-c.pt",
    }


@pytest.mark.parametrize("pointer", ["not json", "[1, 2]", '{"dcn": 3}'])
def test_a_broken_pointer_is_replaced_not_fatal(tmp_path: Path, pointer: str) -> None:
    (tmp_path / LATEST).write_text(pointer)
    point_latest(tmp_path, "reranker", tmp_path / "reranker-e.pt")
    assert json.loads((tmp_path / LATEST).read_text())["reranker"] == "reranker-e.pt"


def test_versioned_files_resolve_through_the_pointer(tmp_path: Path) -> None:
    meta: dict[str, object] = {"kind": "reranker", "x": 1}
    path = write_versioned(tmp_path, "reranker", "test/1", meta, {"w": torch.ones(2)})
    assert path.name == f"reranker-{meta['model_version']}.pt"
    with pytest.raises(ArtifactError, match="headwater funnel train-reranker"):
        resolve_model_path(tmp_path, "reranker", "headwater funnel train-reranker")
    point_latest(tmp_path, "reranker", path)
    assert resolve_model_path(tmp_path, "reranker") == path
