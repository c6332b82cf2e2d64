"""Before the first ``headwater apply`` the example sources stand in silently (issue 37 item 4).

``infra/services.sh`` runs ``headwater topics create`` at every service start; with no plan yet
that is the normal state and must not print a "run headwater apply first" line. A plan that exists
but cannot be read is still reported.
"""

from __future__ import annotations

from pathlib import Path

from headwater.pipelines.events.sources import example_sources, sources_or_examples
from headwater.registry.plans import plan_path


def test_no_plan_yet_gives_the_example_sources_and_no_reason(tmp_path: Path) -> None:
    sources, why = sources_or_examples(tmp_path)
    assert why is None
    assert [s.name for s in sources] == [s.name for s in example_sources()] == ["events", "payments"]


def test_an_unreadable_plan_is_reported_with_its_path(tmp_path: Path) -> None:
    path = plan_path(tmp_path, "offline")
    path.parent.mkdir(parents=True)
    path.write_text("{not json", encoding="utf-8")
    sources, why = sources_or_examples(tmp_path)
    assert [s.name for s in sources] == ["events", "payments"]
    assert why is not None
    assert str(path) in why
