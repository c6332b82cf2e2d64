"""Find and load the files of a feature repo into typed specs, collecting every problem.

A repo is a folder with ``entities.yaml``, ``sources.yaml`` and ``budget.yaml`` and one YAML file
per feature view anywhere below it (``schemas/`` and hidden folders are skipped). Each list item
and each feature is validated on its own, so one bad entry does not hide the others' errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from headwater.registry.diagnostics import Diagnostic, Diagnostics, display_path
from headwater.registry.models import (
    BudgetFile,
    EntitySpec,
    FeatureDefinition,
    OnDemandViewDefinition,
    SourceSpec,
    ViewDefinition,
    ViewHeader,
)
from headwater.registry.spec_errors import spec_diagnostics
from headwater.registry.yamlsrc import Path_, YamlDoc, YamlSyntaxError, parse_yaml

SPECIAL_FILES = ("entities.yaml", "sources.yaml", "budget.yaml")
SKIPPED_DIRS = ("schemas",)
T = TypeVar("T", bound=BaseModel)


@dataclass(frozen=True)
class Located(Generic[T]):
    """A validated spec with the file it came from and the path of its node in that file."""

    spec: T
    file: str
    path: Path
    doc: YamlDoc
    prefix: Path_ = ()

    @property
    def line(self) -> int:
        """The line where this spec starts."""
        return self.doc.line_of(self.prefix)

    def line_of(self, *keys: str | int) -> int:
        """Return the line of a key below this spec (``line_of("features", 0, "window")``)."""
        return self.doc.line_of((*self.prefix, *keys))


@dataclass
class LoadedRepo:
    """Everything that loaded; what did not is in ``diagnostics``."""

    root: Path
    entities: dict[str, Located[EntitySpec]] = field(default_factory=dict)
    sources: dict[str, Located[SourceSpec]] = field(default_factory=dict)
    budget: Located[BudgetFile] | None = None
    views: list[Located[ViewDefinition]] = field(default_factory=list)
    on_demand: list[Located[OnDemandViewDefinition]] = field(default_factory=list)
    """Views of ``tier: on_demand`` (checked by :mod:`headwater.registry.validate_on_demand`)."""
    view_files: int = 0
    diagnostics: Diagnostics = field(default_factory=Diagnostics)


def view_files(root: Path) -> list[Path]:
    """List the feature view files of the repo at ``root``, sorted."""
    found = []
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if path.suffix not in (".yaml", ".yml") or not path.is_file():
            continue
        if any(part.startswith(".") or part in SKIPPED_DIRS for part in rel.parts[:-1]):
            continue
        if len(rel.parts) == 1 and rel.name in SPECIAL_FILES:
            continue
        found.append(path)
    return sorted(found)


def load_repo(root: Path) -> LoadedRepo:
    """Load the repo at ``root``; every problem found goes to ``LoadedRepo.diagnostics``."""
    repo = LoadedRepo(root=root)
    if not root.is_dir():
        repo.diagnostics.add(
            Diagnostic(
                code="missing-file",
                message=f"feature repo '{root}' is not a folder",
                file=str(root),
                expected="a folder with entities.yaml, sources.yaml, budget.yaml and view files",
                found="no such folder",
                hint="pass the path of the feature repo, e.g. `headwater check features/`",
            )
        )
        return repo
    _load_named_list(repo, "entities.yaml", "entities", EntitySpec, repo.entities)
    _load_named_list(repo, "sources.yaml", "sources", SourceSpec, repo.sources)
    _load_budget(repo)
    for path in view_files(root):
        repo.view_files += 1
        view = _load_view(repo, path)
        if view is not None:
            repo.views.append(view)
    return repo


def _read(repo: LoadedRepo, path: Path) -> tuple[str, YamlDoc | None]:
    file = display_path(path, repo.root)
    if not path.is_file():
        repo.diagnostics.add(
            Diagnostic(
                code="missing-file",
                message=f"{path.name} is missing",
                file=file,
                expected=f"{path.name} in the feature repo",
                found="no such file",
                hint=f"create {path.name} (see features/{path.name} in the headwater repo for an example)",
            )
        )
        return file, None
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        repo.diagnostics.add(
            Diagnostic(
                code="bad-encoding",
                message=f"the file is not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start}",
                file=file,
                line=raw.count(b"\n", 0, exc.start) + 1,
                expected="a UTF-8 encoded YAML file",
                found=f"{exc.reason} (byte 0x{raw[exc.start]:02x})",
                hint="save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`), or remove the stray byte",
            )
        )
        return file, None
    try:
        return file, parse_yaml(text)
    except YamlSyntaxError as exc:
        repo.diagnostics.add(
            Diagnostic(
                code=exc.code,
                message=f"not valid YAML: {exc}" if exc.code == "bad-yaml" else str(exc),
                file=file,
                line=exc.line,
                expected="a YAML mapping",
                found="a syntax error" if exc.code == "bad-yaml" else exc.code.replace("-", " "),
                hint=exc.hint
                or "fix the YAML at this line (indentation, a missing ':' or an unclosed quote)",
            )
        )
        return file, None


def _top_mapping(repo: LoadedRepo, file: str, doc: YamlDoc, keys: tuple[str, ...]) -> dict[str, Any] | None:
    if not isinstance(doc.data, dict):
        repo.diagnostics.add(
            Diagnostic(
                code="bad-value",
                message="the file must be a YAML mapping",
                file=file,
                line=doc.line_of(()),
                expected=f"a mapping with keys: {', '.join(keys)}",
                found="an empty file" if doc.data is None else type(doc.data).__name__,
                hint=f"start the file with '{keys[0]}:'",
            )
        )
        return None
    return doc.data


def _load_named_list(repo: LoadedRepo, name: str, key: str, model: type[Any], into: dict[str, Any]) -> None:
    file, doc = _read(repo, repo.root / name)
    if doc is None:
        return
    data = _top_mapping(repo, file, doc, (key,))
    if data is None:
        return
    for extra in sorted(set(data) - {key}):
        repo.diagnostics.add(
            Diagnostic(
                code="unknown-key",
                message=f"unknown key '{extra}'",
                file=file,
                line=doc.line_of((extra,)),
                expected=f"only '{key}' at the top of {name}",
                found=extra,
                hint="remove it",
            )
        )
    items = data.get(key)
    if not isinstance(items, list):
        repo.diagnostics.add(
            Diagnostic(
                code="bad-value",
                message=f"'{key}' must be a list",
                file=file,
                line=doc.line_of((key,)),
                expected=f"a list of {key} ('- name: ...')",
                found="nothing" if items is None else type(items).__name__,
                hint=f"write '{key}:' followed by '- name: ...' items",
            )
        )
        return
    for index, item in enumerate(items):
        located = _validate_item(repo, file, doc, (key, index), model, item)
        if located is None:
            continue
        item_name = located.spec.name
        if item_name in into:
            repo.diagnostics.add(_duplicate(SINGULAR.get(key, key), item_name, located, into[item_name]))
            continue
        into[item_name] = located


def _validate_item(
    repo: LoadedRepo, file: str, doc: YamlDoc, prefix: Path_, model: type[T], item: Any
) -> Located[T] | None:
    try:
        spec = model.model_validate(item)
    except ValidationError as exc:
        for diag in spec_diagnostics(exc, model, _shifted(doc, prefix), file, None):
            repo.diagnostics.add(diag)
        return None
    return Located(spec=spec, file=file, path=repo.root / file, doc=doc, prefix=prefix)


def _shifted(doc: YamlDoc, prefix: Path_) -> YamlDoc:
    """Return a view of ``doc`` rooted at ``prefix`` (so pydantic locs relative to an item find lines)."""
    size = len(prefix)
    lines = {p[size:]: line for p, line in doc.lines.items() if p[:size] == prefix}
    data: Any = doc.data
    for part in prefix:
        data = data[part]
    return YamlDoc(data=data, lines=lines)


SINGULAR = {"entities": "entity", "sources": "source", "views": "view"}
"""The singular of each list key of the registry files, for messages (``entities``[:-1] is not a word)."""


def _duplicate(kind: str, name: str, new: Located[Any], first: Located[Any]) -> Diagnostic:
    return Diagnostic(
        code="duplicate-name",
        message=f"{kind} '{name}' is defined twice",
        file=new.file,
        line=new.line,
        view=name if kind == "view" else None,
        expected=f"one {kind} named '{name}'",
        found=f"another definition at {first.file}:{first.line}",
        hint=f"rename one of them or delete the copy; {kind} names are global across the repo",
    )


def _load_budget(repo: LoadedRepo) -> None:
    file, doc = _read(repo, repo.root / "budget.yaml")
    if doc is None or _top_mapping(repo, file, doc, ("tiers", "owners", "unit")) is None:
        return
    repo.budget = _validate_item(repo, file, doc, (), BudgetFile, doc.data)


def _load_view(repo: LoadedRepo, path: Path) -> Located[ViewDefinition] | None:
    file, doc = _read(repo, path)
    if doc is None:
        return None
    data = _top_mapping(repo, file, doc, ("feature_view",))
    if data is None:
        return None
    view_name = data.get("feature_view") if isinstance(data.get("feature_view"), str) else None
    if data.get("tier") == "on_demand":  # request-time features: another schema, checked apart
        try:
            on_demand = OnDemandViewDefinition.model_validate(data)
        except ValidationError as exc:
            repo.diagnostics.extend(spec_diagnostics(exc, OnDemandViewDefinition, doc, file, view_name))
            return None
        repo.on_demand.append(Located(spec=on_demand, file=file, path=path, doc=doc))
        return None
    features: list[FeatureDefinition] = []
    raw_features = data.get("features")
    if isinstance(raw_features, list):
        for index, raw in enumerate(raw_features):
            try:
                features.append(FeatureDefinition.model_validate(raw))
            except ValidationError as exc:
                sub = _shifted(doc, ("features", index))
                for diag in spec_diagnostics(exc, FeatureDefinition, sub, file, view_name):
                    repo.diagnostics.add(_with_feature(diag, raw, index))
    try:
        header = ViewHeader.model_validate(data)
    except ValidationError as exc:
        repo.diagnostics.extend(spec_diagnostics(exc, ViewDefinition, doc, file, view_name))
        return None
    if not features:
        return None
    spec = ViewDefinition.model_construct(**{**dict(header), "features": features})
    return Located(spec=spec, file=file, path=path, doc=doc)


def _with_feature(diag: Diagnostic, raw: Any, index: int) -> Diagnostic:
    name = raw.get("name") if isinstance(raw, dict) else None
    return replace(diag, feature=str(name) if name is not None else f"#{index + 1}")
