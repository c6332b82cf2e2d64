"""Files headwater ships besides its code: the example feature repo and the Maven project of its jars.

A wheel carries them as package data (setup.py copies them in): ``headwater/examples/features``
(the template of ``headwater init``) and ``headwater/jvm`` (``pom.xml``, the module poms and the
Java sources of the realtime operator, built by ``headwater setup jars``). A source checkout (an
editable install) reads the same files where they live in the checkout: ``features/`` and
``infra/``.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]
"""``site-packages/headwater`` for a wheel; the checkout's root for an editable install."""


def checkout_root() -> Path | None:
    """Return the source checkout this code runs from, or None for an installed wheel."""
    if (_PACKAGE / "setup.py").is_file() and (_PACKAGE / "infra" / "pom.xml").is_file():
        return _PACKAGE
    return None


def example_features() -> Path:
    """Return the example feature repo (entities, sources, budget, views, Avro schemas)."""
    root = checkout_root()
    return root / "features" if root is not None else _PACKAGE / "examples" / "features"


def jvm_project() -> Path:
    """Return the folder of the Maven project that resolves the tiers' jars (its ``pom.xml`` at the top)."""
    root = checkout_root()
    return root / "infra" if root is not None else _PACKAGE / "jvm"
