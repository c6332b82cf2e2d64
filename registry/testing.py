"""Helpers for testing feature repos: a scratch repo in a temp folder, line lookup in YAML text.

Used by headwater's own tests and usable by teams that test their feature definitions::

    repo = ScratchRepo(tmp_path / "features", template=Path("features"))
    repo.write("v1.yaml", MINIMAL_VIEW.replace("window: 30s", "window: 2h"))
    assert [d.code for d in repo.check().diagnostics.errors] == ["window-too-long"]
"""

from __future__ import annotations

import shutil
from pathlib import Path

from headwater.registry.compiled import CheckResult
from headwater.registry.validate import check_repo

SHARED_FILES = ("entities.yaml", "sources.yaml", "budget.yaml")

MINIMAL_VIEW = """\
feature_view: v1
entity: user
source: events
tier: realtime
freshness_sla: PT10S
compute_cost: 10
owner: team-a
description: a small test view
features:
  - name: clicks_30s
    agg: count
    where: "event_type = 'click'"
    window: 30s
"""


class ScratchRepo:
    """A feature repo in ``root`` with the entities, sources, budget and schemas of ``template``."""

    def __init__(self, root: Path, template: Path) -> None:
        self.root = root
        root.mkdir(parents=True)
        for name in SHARED_FILES:
            shutil.copy(template / name, root / name)
        shutil.copytree(template / "schemas", root / "schemas")

    def write(self, name: str, text: str) -> Path:
        """Write a file of the repo (a view, or one of the shared files) and return its path."""
        path = self.root / name
        path.write_text(text, encoding="utf-8")
        return path

    def check(self) -> CheckResult:
        """Run ``check`` on the repo."""
        return check_repo(self.root)


def line_of(text: str, needle: str, occurrence: int = 1) -> int:
    """1-based line of the ``occurrence``-th line of ``text`` that contains ``needle``."""
    hits = [i + 1 for i, line in enumerate(text.splitlines()) if needle in line]
    return hits[occurrence - 1]
