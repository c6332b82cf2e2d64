"""The layers beyond what import-linter checks: no private name crosses a package, no library imports the CLI.

import-linter (``make lint``) checks the layer order; these read every module's imports (top-level
and inside functions) with ``ast``, so a private helper borrowed across packages fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("registry", "pipelines", "ranking", "serving", "client", "cli")


def _imports(package: str) -> list[tuple[str, int, str, list[str]]]:
    """Return (file, line, imported module, names) for every absolute headwater import in ``package``."""
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        if "_pb2" in path.name:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and (node.module or "").startswith("headwater.")
            ):
                found.append(
                    (
                        str(path.relative_to(ROOT)),
                        node.lineno,
                        node.module or "",
                        [a.name for a in node.names],
                    )
                )
            elif isinstance(node, ast.Import):
                found += [
                    (str(path.relative_to(ROOT)), node.lineno, a.name, [])
                    for a in node.names
                    if a.name.startswith("headwater.")
                ]
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_private_name_is_imported_from_another_package(package: str) -> None:
    crossing = [
        f"{file}:{line} imports {names} from {module}"
        for file, line, module, names in _imports(package)
        if module.split(".")[1] != package and any(n.startswith("_") for n in names)
    ]
    assert crossing == []


@pytest.mark.parametrize("package", [p for p in PACKAGES if p != "cli"])
def test_no_library_module_imports_the_cli(package: str) -> None:
    # Imports inside functions count too: import-linter sees them, but a lazy import is where a
    # library module would most likely borrow a CLI helper.
    into_cli = [
        f"{file}:{line} imports {module}"
        for file, line, module, _ in _imports(package)
        if module == "headwater.cli" or module.startswith("headwater.cli.")
    ]
    assert into_cli == []


def test_the_check_sees_imports() -> None:
    # The walk above must find the CLI's many imports, or the two tests above prove nothing.
    modules = {module for _, _, module, _ in _imports("cli")}
    assert "headwater.registry.config" in modules
    assert any(m.startswith("headwater.serving.") for m in modules)
