"""Diagnostics spell their nouns right (issue 37 item 5): no "entitie names", no "entitys.yaml"."""

from __future__ import annotations

import re

from headwater.registry.diagnostics import Diagnostic
from headwater.registry.testing import MINIMAL_VIEW as VIEW
from headwater.registry.testing import ScratchRepo as Repo


def _text(d: Diagnostic) -> str:
    return " ".join(str(x) for x in (d.message, d.expected, d.found, d.hint) if x)


def test_a_duplicate_entity_is_called_an_entity(repo: Repo) -> None:
    repo.write(
        "entities.yaml",
        "entities:\n  - name: user\n    join_key: user_id\n  - name: user\n    join_key: user_id\n",
    )
    repo.write("v1.yaml", VIEW)
    diag = next(d for d in repo.check().diagnostics.items if d.code == "duplicate-name")
    assert diag.message == "entity 'user' is defined twice"
    assert diag.hint == "rename one of them or delete the copy; entity names are global across the repo"


def test_a_duplicate_source_is_called_a_source(repo: Repo) -> None:
    text = (repo.root / "sources.yaml").read_text(encoding="utf-8")
    first = text.index("  - name:")
    second = text.find("  - name:", first + 1)
    repo.write("sources.yaml", text + text[first : second if second > 0 else len(text)])
    diags = [d for d in repo.check().diagnostics.items if d.code == "duplicate-name"]
    assert diags, [d.code for d in repo.check().diagnostics.items]
    assert diags[0].message.startswith("source '")
    assert "source names are global" in (diags[0].hint or "")


def test_an_unknown_entity_with_none_declared_names_the_entities_file(repo: Repo) -> None:
    repo.write("entities.yaml", "entities: []\n")
    repo.write("v1.yaml", VIEW)
    diag = next(d for d in repo.check().diagnostics.items if d.code == "unknown-entity")
    assert diag.hint == "declare it in entities.yaml"
    assert diag.expected == "one of: (no entities declared)"


def test_no_diagnostic_of_a_broken_repo_has_a_bad_plural(repo: Repo) -> None:
    repo.write("entities.yaml", "entities:\n  - name: user\n    join_key: user_id\n" * 2)
    repo.write("v1.yaml", VIEW.replace("entity: user", "entity: usr").replace("source: events", "source: x"))
    texts = [_text(d) for d in repo.check().diagnostics.items]
    assert texts
    for text in texts:
        assert not re.search(r"\bentitie\b|\bentitys\b|\bentitie names\b", text), text
