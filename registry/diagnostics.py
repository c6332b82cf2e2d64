"""Diagnostics: every problem ``headwater check`` finds, with where it is and what to do.

A diagnostic names the file and line, the view and feature when there is one, what was expected,
what was found, and a fix. Checks append to a :class:`Diagnostics` list and go on, so one run
reports every error rather than the first.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path


class Severity(StrEnum):
    """Errors fail ``check`` (exit 1); warnings are printed and do not."""

    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True)
class Diagnostic:
    """One finding of ``check``.

    Attributes:
        code: stable kebab-case identifier (``unknown-key``, ``over-budget``...), for tools and tests.
        message: one sentence saying what is wrong.
        file: the YAML file (relative to the repo when possible).
        line: 1-based line in ``file``; 0 when the whole file is concerned.
        view / feature: the feature view and feature concerned, when there is one.
        expected / found: what the registry expected and what it found.
        hint: what to do about it.
        detail: extra lines (e.g. a table of the largest consumers), printed below the message.
    """

    code: str
    message: str
    file: str
    line: int = 0
    severity: Severity = Severity.ERROR
    view: str | None = None
    feature: str | None = None
    expected: str | None = None
    found: str | None = None
    hint: str | None = None
    detail: str | None = None

    def location(self) -> str:
        """``file:line`` (or just ``file``)."""
        return f"{self.file}:{self.line}" if self.line else self.file

    def format(self) -> str:
        """Human-readable, multi-line rendering used by ``headwater check``."""
        subject = ""
        if self.view:
            subject = f" view '{self.view}'" + (f", feature '{self.feature}'" if self.feature else "") + ":"
        lines = [f"{self.location()}: {self.severity.value} [{self.code}]{subject} {self.message}"]
        if self.expected is not None:
            lines.append(f"    expected: {self.expected}")
        if self.found is not None:
            lines.append(f"    found:    {self.found}")
        if self.hint:
            lines.append(f"    fix:      {self.hint}")
        if self.detail:
            lines.extend("    " + row for row in self.detail.splitlines())
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        """Return a JSON-ready dict (``headwater check --format json``)."""
        data = asdict(self)
        data["severity"] = self.severity.value
        return data


@dataclass
class Diagnostics:
    """An ordered collection of findings that checks append to."""

    items: list[Diagnostic] = field(default_factory=list)

    def add(self, diagnostic: Diagnostic) -> None:
        """Record one finding."""
        self.items.append(diagnostic)

    def extend(self, diagnostics: list[Diagnostic]) -> None:
        """Record several findings."""
        self.items.extend(diagnostics)

    @property
    def errors(self) -> list[Diagnostic]:
        """The findings that fail the check."""
        return [d for d in self.items if d.severity is Severity.ERROR]

    @property
    def warnings(self) -> list[Diagnostic]:
        """The findings that are only printed."""
        return [d for d in self.items if d.severity is Severity.WARNING]

    def sorted(self) -> list[Diagnostic]:
        """Return the findings ordered by file, line, then code (stable output for CI logs)."""
        return sorted(self.items, key=lambda d: (d.file, d.line, d.code, d.message))


def display_path(path: Path, root: Path) -> str:
    """``path`` relative to ``root``'s parent when inside it (``features/x.yaml``), else as given."""
    base = root.parent
    try:
        return str(path.relative_to(base))
    except ValueError:
        pass
    try:
        return str(path.resolve().relative_to(root.resolve().parent))
    except ValueError:
        return str(path)
