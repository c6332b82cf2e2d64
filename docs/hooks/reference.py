"""MkDocs hook: the reference pages generated from the code at build time (never committed).

- ``reference/yaml.md``: every field of the YAML files a user writes, from the pydantic models
  (``headwater.registry.models`` for the feature repo, ``headwater.registry.config`` for
  ``headwater.yaml``, ``headwater.serving.config`` for ``headwater serve --config``): type, default,
  constraints, and the field's docstring.
- ``reference/http.md``: the service's OpenAPI document, from the FastAPI app itself, built the way
  ``tests/unit/serving`` build it (an in-memory store, a two-view registry, no model), so no
  service, Redis or trained model is needed.
- ``reference/grpc.md``: the proto files under ``client/proto/headwater/v1/`` (the ranking service's
  ``ranking.proto``, the push API's ``ingest.proto``), each one's services and messages as tables,
  then the file verbatim.

The CLI page is not generated here: ``reference/cli.md`` holds a ``::: mkdocs-click`` directive
that mkdocs-click expands from the click group at build time.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import textwrap
import types
import typing
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "client" / "proto" / "headwater" / "v1"
PROTOS = (
    (
        "ranking.proto",
        "the ranking service",
        "`headwater serve --grpc-port PORT` serves it from the same process, engine, fallbacks and "
        "`/metrics` as the [HTTP API](http.md). "
        '`headwater.client.RankingClient("host:port", protocol="grpc")` calls it.',
    ),
    (
        "ingest.proto",
        "the push API",
        "`headwater ingest serve --grpc-port PORT` serves it beside REST's "
        "`POST /v1/sources/{source}/events`, with the same checks and answers "
        "([push ingest tutorial](../tutorials/push-ingest.md)). "
        '`headwater.client.IngestClient("host:port", protocol="grpc")` calls it.',
    ),
)
"""Each proto file of the reference: its name, what it serves, who serves and calls it."""
GENERATED = "<!-- Generated at build time by docs/hooks/reference.py; edit the code, not this page. -->\n\n"


def on_files(files: Files, config: Any) -> Files:
    """Add the generated reference pages to the site's files."""
    for uri, render in (
        ("reference/yaml.md", yaml_page),
        ("reference/http.md", http_page),
        ("reference/grpc.md", grpc_page),
    ):
        files.append(File.generated(config, uri, content=GENERATED + render()))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Fill the generated blocks of hand-written pages (``<!-- generated: tiers -->``)."""
    return markdown.replace("<!-- generated: tiers -->", tiers_table())


def tiers_table() -> str:
    """Return what each tier can deliver, from the registry's tier table (``headwater.registry.tiers``)."""
    from headwater.registry.durations import format_seconds
    from headwater.registry.tiers import ALL_AGGS, TIERS

    out = [
        "| tier | freshness floor | longest window | default slide | one slide per view | aggregations |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for tier in TIERS.values():
        aggs = "all" if tier.aggregations == ALL_AGGS else ", ".join(sorted(tier.aggregations))
        out.append(
            f"| `{tier.name}` | {format_seconds(tier.freshness_floor_s)} | "
            f"{format_seconds(tier.max_window_s)} | {format_seconds(tier.default_slide_s)} | "
            f"{'yes' if tier.one_slide_per_view else 'no'} | {aggs} |"
        )
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- YAML: pydantic models


def _attribute_docs(cls: type) -> dict[str, str]:
    """Return the attribute docstrings of a class body (the string right after ``name: T = ...``)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for stmt, following in zip(body, [*body[1:], None], strict=True):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[stmt.target.id] = inspect.cleandoc(following.value.value)
    return docs


_ROLE = re.compile(r":(?:class|mod|func|meth|attr|data|obj):`~?([^`]+)`")


def _md(text: str) -> str:
    """Docstring text to Markdown: ``code`` to `code`, Sphinx roles to their (short) target."""
    text = _ROLE.sub(
        lambda m: f"`{m.group(1).rsplit('.', 1)[-1] if '~' in m.group(0) else m.group(1)}`", text
    )
    return text.replace("``", "`")


def _supplements() -> dict[tuple[type, str], str]:
    """Meanings of the feature-repo fields whose models carry no docstring for them yet.

    A field's own docstring wins. Every name here must be a field of its model (the build fails
    otherwise), and the defaults quoted come from the registry's constants, so nothing here can drift
    from the code unnoticed.
    """
    from headwater.registry import models, sources
    from headwater.registry.durations import format_seconds
    from headwater.registry.tiers import TIERS

    slides = ", ".join(f"{t.name} {format_seconds(t.default_slide_s)}" for t in TIERS.values())
    floors = ", ".join(f"{t.name} {format_seconds(t.freshness_floor_s)}" for t in TIERS.values())
    m = models
    table = {
        (m.EntitySpec, "name"): "The entity's name, as views name it in `entity:`.",
        (m.EntitySpec, "join_key"): "The event field whose value keys the entity's feature values.",
        (m.EntitySpec, "description"): "Free text.",
        (m.SourceSpec, "name"): "The source's name, as views name it in `source:`.",
        (m.SourceSpec, "topic"): "The Kafka topic its events are produced to.",
        (m.SourceSpec, "schema_path"): "The current Avro schema (`.avsc`), relative to the features folder.",
        (m.SourceSpec, "event_time"): "The field that holds each event's time.",
        (m.SourceSpec, "expected_rate_per_s"): "Events per second the source carries: the cost model's "
        "input (events a day = rate x 86,400).",
        (
            m.SourceSpec,
            "max_out_of_orderness",
        ): "How far behind its partition's newest event an event may be: "
        f"the watermark delay. Default {format_seconds(sources.DEFAULT_MAX_OUT_OF_ORDERNESS_S)}.",
        (
            m.SourceSpec,
            "allowed_lateness",
        ): "How much later than that an event is still accepted; a later one "
        f"is dead-lettered as `late`. Default {format_seconds(sources.DEFAULT_ALLOWED_LATENESS_S)}.",
        (m.SourceSpec, "description"): "Free text.",
        (m.BudgetFile, "unit"): "The unit of every figure of the file.",
        (m.BudgetFile, "tiers"): "CPU-hours a day each tier may be charged.",
        (m.BudgetFile, "owners"): "CPU-hours a day each owner (a view's `owner`) may be charged.",
        (m.ViewHeader, "feature_view"): "The view's name.",
        (m.ViewHeader, "entity"): "An entity of `entities.yaml`: what the values are keyed by.",
        (m.ViewHeader, "source"): "A source of `sources.yaml`: the events the view aggregates.",
        (m.ViewHeader, "tier"): "The pipeline tier that computes the view.",
        (m.ViewHeader, "freshness_sla"): "The largest age a value may have when it is read; it must not be "
        f"tighter than the tier's floor ({floors}).",
        (m.ViewHeader, "compute_cost"): "Declared CPU-hours a day; `check` compares it with its estimate and "
        "charges the larger of the two to the budget.",
        (m.ViewHeader, "owner"): "The team the view's cost is charged to (`owners` of `budget.yaml`).",
        (m.ViewHeader, "description"): "Free text; changes no version.",
        (
            m.ViewHeader,
            "features",
        ): "The view's features, one slot (or more, for `top_k`) each in its online vector.",
        (m.ViewHeader, "tags"): "Free-form labels.",
        (m.FeatureDefinition, "name"): "The feature's name: its slot in the view's online vector.",
        (m.FeatureDefinition, "agg"): "The aggregation ([Windows](../concepts/windows.md) defines each).",
        (m.FeatureDefinition, "window"): "The window W: the value at boundary B aggregates `[B - W, B)`.",
        (
            m.FeatureDefinition,
            "field",
        ): "The event field aggregated (for `count`: events where it is not null).",
        (m.FeatureDefinition, "where"): "A filter over the event's fields (`event_type = 'click'`).",
        (
            m.FeatureDefinition,
            "slide",
        ): f"The step S of the hopping window; it divides W. Default: the tier's ({slides}).",
        (m.FeatureDefinition, "k"): "For `top_k`: how many values.",
        (m.FeatureDefinition, "numerator"): "For `ratio`: the aggregation divided.",
        (
            m.FeatureDefinition,
            "denominator",
        ): "For `ratio`: the aggregation it is divided by; 0 gives a missing value.",
        (m.FeatureDefinition, "description"): "Free text; changes no version.",
        (m.OperandDefinition, "agg"): "The operand's aggregation.",
        (m.OperandDefinition, "field"): "The event field it aggregates.",
        (m.OperandDefinition, "where"): "The operand's own filter.",
        (m.OnDemandViewDefinition, "feature_view"): "The view's name.",
        (m.OnDemandViewDefinition, "tier"): "Always `on_demand`: computed by the service per request.",
        (m.OnDemandViewDefinition, "owner"): "The owning team.",
        (m.OnDemandViewDefinition, "description"): "Free text.",
        (m.OnDemandViewDefinition, "features"): "The request-time features.",
        (m.OnDemandViewDefinition, "tags"): "Free-form labels.",
        (m.OnDemandFeatureDefinition, "name"): "The feature's name.",
        (m.OnDemandFeatureDefinition, "expression"): "Arithmetic over the inputs and the request "
        "(`request.time`, `hour_of_day`, `share_of`); a division by zero is missing.",
    }
    for model, name in table:
        if name not in model.model_fields:
            msg = f"docs/hooks/reference.py: {model.__name__} has no field {name!r}; update the supplement"
            raise RuntimeError(msg)
    return table


def _is_model(tp: Any) -> bool:
    from pydantic import BaseModel

    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _type_name(tp: Any, anchors: dict[type, str]) -> str:
    """Return a reader's name for an annotation: ``list of string``, ``duration``, a model link."""
    from headwater.registry.durations import Duration

    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return _type_name(args[0], anchors)
    if origin in (typing.Union, types.UnionType):
        kept = [a for a in args if a is not type(None)]
        name = " or ".join(_type_name(a, anchors) for a in kept)
        return f"{name} or null" if len(kept) < len(args) else name
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (list, tuple, set, frozenset):
        inner = [a for a in args if a is not Ellipsis]
        return f"list of {_type_name(inner[0], anchors)}" if inner else "list"
    if origin is dict:
        return f"map of {_type_name(args[0], anchors)} to {_type_name(args[1], anchors)}"
    if tp is Duration:
        return "duration (`30s`, `5m`, `PT5M`)"
    if _is_model(tp):
        return f"[{tp.__name__}](#{anchors.get(tp, tp.__name__.lower())})"
    names = {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path"}
    if tp in names:
        return names[tp]
    return getattr(tp, "__name__", str(tp)).replace("|", "\\|")


def _constraints(field: Any) -> str:
    parts: list[str] = []
    symbols = {
        "gt": ">",
        "ge": ">=",
        "lt": "<",
        "le": "<=",
        "min_length": "length >=",
        "max_length": "length <=",
    }
    for meta in field.metadata:
        for attr, symbol in symbols.items():
            value = getattr(meta, attr, None)
            if value is not None:
                parts.append(f"{symbol} {value}")
        pattern = getattr(meta, "pattern", None)
        if pattern:
            parts.append(f"matches `{pattern}`")
    return ", ".join(parts)


def _default(field: Any) -> str:
    from pydantic_core import PydanticUndefined

    if field.is_required():
        return "**required**"
    value = field.default_factory() if field.default_factory is not None else field.default
    if value is PydanticUndefined:
        return ""
    if _is_model(type(value)):
        return "(its defaults)"
    if isinstance(value, Path):
        value = str(value)
    text = json.dumps(value, default=str)
    return f"`{text}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _models_in(root: type) -> list[type]:
    """``root`` and every model its fields reach, depth first, each once."""
    seen: list[type] = []

    def walk(tp: Any) -> None:
        if _is_model(tp):
            if tp in seen:
                return
            seen.append(tp)
            for field in tp.model_fields.values():
                walk(field.annotation)
            return
        for arg in typing.get_args(tp):
            walk(arg)

    walk(root)
    return seen


def _model_section(
    cls: type, anchors: dict[type, str], level: str, extra_docs: dict[tuple[type, str], str]
) -> str:
    docs: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        docs.update(_attribute_docs(base) if base.__module__.startswith("headwater") else {})
        docs.update(
            {name: text for (model, name), text in extra_docs.items() if model is base and name not in docs}
        )
    out = [f"{level} {cls.__name__} {{#{anchors[cls]}}}\n"]
    if cls.__doc__:
        out.append(_md(inspect.cleandoc(cls.__doc__)) + "\n")
    extra = cls.model_config.get("extra")
    if extra == "forbid":
        out.append("Unknown keys are errors.\n")
    out.append("| field | type | default | constraints | meaning |")
    out.append("| --- | --- | --- | --- | --- |")
    for name, field in cls.model_fields.items():
        key = field.alias or name
        meaning = docs.get(name) or field.description or ""
        out.append(
            f"| `{key}` | {_type_name(field.annotation, anchors)} | {_default(field)} | "
            f"{_cell(_constraints(field))} | {_cell(_md(meaning))} |"
        )
    return "\n".join(out) + "\n"


def yaml_page() -> str:
    """Return the YAML reference page: every model the user's files are read into."""
    from headwater.registry import config, models
    from headwater.serving import config as serving_config

    groups: list[tuple[str, str, list[type]]] = [
        (
            "The feature repo (`features/`)",
            "Read by `headwater check`, `plan` and `apply` (module `headwater.registry.models`). Models are "
            'strict: no silent `"5"` to `5`; every error names the file and the line.',
            [
                models.EntitiesFile,
                models.SourcesFile,
                models.BudgetFile,
                models.ViewDefinition,
                models.OnDemandViewDefinition,
            ],
        ),
        (
            "`headwater.yaml`",
            "Where a feature repo's platform is (module `headwater.registry.config`). `HEADWATER_*` "
            "environment variables override it and command-line options override both.",
            [config.RepoConfig],
        ),
        (
            "The serving config (`headwater serve --config FILE`)",
            "Any field may be overridden by the YAML file (module `headwater.serving.config`).",
            [serving_config.ServingConfig],
        ),
    ]
    files = {
        models.EntitiesFile: "`entities.yaml`",
        models.SourcesFile: "`sources.yaml`",
        models.BudgetFile: "`budget.yaml`",
        models.ViewDefinition: "one file per view (`tier: realtime`, `nearline` or `offline`)",
        models.OnDemandViewDefinition: "one file per request-time view (`tier: on_demand`)",
    }
    out = [
        "# YAML files\n",
        "Every field of every YAML file headwater reads, generated from the pydantic models at each docs "
        "build. Durations are text with a unit (`30s`, `5m`, `1h`, `1d`) or ISO-8601 (`PT5M`); a bare "
        "number has no unit and is an error. Where a field links to a model, its value is a mapping of "
        "that model's fields.\n",
    ]
    extra_docs = _supplements()
    anchors: dict[type, str] = {}
    ordered: list[tuple[str, str, list[type]]] = []
    for title, intro, roots in groups:
        found: list[type] = []
        for root in roots:
            for model in _models_in(root):
                if model not in anchors and model not in found:
                    found.append(model)
        for model in found:
            anchors[model] = f"{model.__module__.rsplit('.', 1)[-1]}-{model.__name__}".lower()
        ordered.append((title, intro, found))
    for title, intro, found in ordered:
        out.append(f"## {title}\n\n{intro}\n")
        for model in found:
            if model in files:
                out.append(f"*File:* {files[model]}\n")
            out.append(_model_section(model, anchors, "###", extra_docs))
    return "\n".join(out)


# ---------------------------------------------------------------- HTTP: OpenAPI


def openapi_document() -> dict[str, Any]:
    """Return the service's OpenAPI document, from an app on an in-memory store (as unit tests do)."""
    from headwater.ranking.synthetic import small_registry
    from headwater.serving.app import create_app
    from headwater.serving.config import ServingConfig
    from headwater.serving.runtime import LoadedModels
    from headwater.serving.store import InMemoryFeatureStore

    registry = small_registry({"u": ["a", "b"]}, {"i": ["x", "y"], "p": ["clicks"]}, "p.clicks")
    app = create_app(
        ServingConfig(), registry, InMemoryFeatureStore(), LoadedModels(None, None, None, None, "cpu")
    )
    return dict(app.openapi())


def _schema_type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(_schema_type(s) for s in schema["anyOf"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list of {_schema_type(schema.get('items', {}))}"
    if kind == "object" and "additionalProperties" in schema:
        value = schema["additionalProperties"]
        return f"map of string to {_schema_type(value) if isinstance(value, dict) else 'any'}"
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    return str(kind)


def _schema_limits(schema: dict[str, Any]) -> str:
    names = {
        "minimum": ">=",
        "maximum": "<=",
        "exclusiveMinimum": ">",
        "exclusiveMaximum": "<",
        "minLength": "length >=",
        "maxLength": "length <=",
        "minItems": "items >=",
        "maxItems": "items <=",
    }
    parts = [f"{symbol} {schema[key]}" for key, symbol in names.items() if key in schema]
    for option in schema.get("anyOf", []):
        parts.extend(f"{symbol} {option[key]}" for key, symbol in names.items() if key in option)
    if "pattern" in schema:
        parts.append(f"matches `{schema['pattern']}`")
    return ", ".join(parts)


def http_page() -> str:
    """Return the HTTP reference page from the OpenAPI document."""
    spec = openapi_document()
    out = [
        "# HTTP API\n",
        f"`{spec['info']['title']}` {spec['info'].get('version', '')}: the ranking service that "
        "`headwater serve` runs. This page is rendered at each docs build from the OpenAPI document of the "
        "FastAPI app itself (`headwater.serving.app.create_app`), built as the unit tests build it: an "
        "in-memory feature store, a two-view registry and no model. Paths, bodies and limits are the "
        "service's own; a running service serves the same document at `/openapi.json`.\n",
        "Every call answers for a well-formed request: when the model, a feature read or the deadline "
        "fails, the answer degrades (neural, linear, popularity, editorial) and says so in `fallback`. "
        "Errors that reach HTTP carry their status and a JSON `detail`.\n",
        "## Operations\n",
    ]
    for path, operations in spec["paths"].items():
        for method, op in operations.items():
            out.append(f"### `{method.upper()} {path}`\n")
            if op.get("summary"):
                out.append(f"**{op['summary']}**\n")
            if op.get("description"):
                out.append(_md(inspect.cleandoc(op["description"])) + "\n")
            params = op.get("parameters", [])
            if params:
                out.append("| parameter | in | type | required | meaning |\n| --- | --- | --- | --- | --- |")
                for p in params:
                    out.append(
                        f"| `{p['name']}` | {p['in']} | {_schema_type(p.get('schema', {}))} | "
                        f"{'yes' if p.get('required') else 'no'} | {_cell(p.get('description', ''))} |"
                    )
                out.append("")
            body = op.get("requestBody", {}).get("content", {})
            for media, content in body.items():
                out.append(f"Request body ({media}): {_schema_type(content.get('schema', {}))}\n")
            out.append("| status | meaning | body |\n| --- | --- | --- |")
            for status, answer in op.get("responses", {}).items():
                schemas = [c.get("schema", {}) for c in answer.get("content", {}).values()]
                shown = ", ".join(_schema_type(s) for s in schemas if s) or "-"
                out.append(f"| {status} | {_cell(answer.get('description', ''))} | {shown} |")
            out.append("")
    out.append("## Schemas\n")
    for name, schema in spec.get("components", {}).get("schemas", {}).items():
        out.append(f"### {name} {{#{name.lower()}}}\n")
        if schema.get("description"):
            out.append(_md(_cell(schema["description"])) + "\n")
        props = schema.get("properties", {})
        if not props:
            out.append(f"Type: {_schema_type(schema)}\n")
            continue
        required = set(schema.get("required", []))
        out.append("| field | type | required | default | limits | meaning |")
        out.append("| --- | --- | --- | --- | --- | --- |")
        for field, prop in props.items():
            default = f"`{json.dumps(prop['default'])}`" if "default" in prop else ""
            out.append(
                f"| `{field}` | {_schema_type(prop)} | {'yes' if field in required else 'no'} | {default} | "
                f"{_cell(_schema_limits(prop))} | {_md(_cell(prop.get('description', '')))} |"
            )
        out.append("")
    out.append("## The OpenAPI document\n")
    out.append('??? note "openapi.json (as generated for this build)"\n')
    out.append(textwrap.indent("```json\n" + json.dumps(spec, indent=2) + "\n```", "    ") + "\n")
    return "\n".join(out)


# ---------------------------------------------------------------- gRPC: the proto file

_BLOCK = re.compile(r"^(service|message|enum)\s+(\w+)\s*\{(.*?)^\}", re.S | re.M)
_RPC = re.compile(r"rpc\s+(\w+)\s*\(\s*(stream\s+)?(\w+)\s*\)\s*returns\s*\(\s*(stream\s+)?(\w+)\s*\)")
_FIELD = re.compile(
    r"^\s*(optional\s+|repeated\s+)?(map<[^>]+>|[\w.]+)\s+(\w+)\s*=\s*(\d+);\s*(?://\s*(.*))?$"
)


def _comment_above(lines: list[str], index: int) -> str:
    found: list[str] = []
    i = index - 1
    while i >= 0 and lines[i].strip().startswith("//"):
        found.insert(0, lines[i].strip()[2:].strip())
        i -= 1
    return " ".join(found)


def grpc_page() -> str:
    """Return the gRPC reference page: a section per proto file of :data:`PROTOS`."""
    out = [
        "# gRPC API\n",
        "The services headwater serves over gRPC, rendered at each docs build from their proto files "
        "(each file itself is at the end of its section). The Python code is generated at `make setup` "
        "and shipped in the wheel.\n",
    ]
    for name, serves, how in PROTOS:
        out.extend(_proto_section(PROTO_DIR / name, serves, how))
    return "\n".join(out)


def _proto_section(path: Path, serves: str, how: str) -> list[str]:
    """Return one proto file's section: its leading comment, services, messages and enums, the file."""
    text = path.read_text(encoding="utf-8")
    package = re.search(r"^package\s+([\w.]+);", text, re.M)
    pkg = package.group(1) if package else ""
    head: list[str] = []
    for line in text.splitlines():  # the file's leading comment
        if not line.startswith("//"):
            break
        head.append(line[2:].strip())
    out = [
        f"## `{path.name}`: {serves}\n",
        f"Package `{pkg}`, from `client/proto/headwater/v1/{path.name}`. {how}\n",
        "> " + " ".join(x for x in head if x) + "\n",
    ]
    for kind, name, body in _BLOCK.findall(text):
        lines = body.splitlines()
        if kind == "service":
            out.append(f"### service `{pkg}.{name}`\n")
            out.append("| method | request | response | meaning |\n| --- | --- | --- | --- |")
            for i, line in enumerate(lines):
                rpc = _RPC.search(line)
                if rpc:
                    req = ("stream " if rpc.group(2) else "") + rpc.group(3)
                    res = ("stream " if rpc.group(4) else "") + rpc.group(5)
                    out.append(
                        f"| `/{pkg}.{name}/{rpc.group(1)}` | [{req}](#{rpc.group(3).lower()}) | "
                        f"[{res}](#{rpc.group(5).lower()}) | {_cell(_comment_above(lines, i))} |"
                    )
            out.append("")
        elif kind == "message":
            out.append(f"#### {name} {{#{name.lower()}}}\n")
            out.append("| # | field | type | label | meaning |\n| --- | --- | --- | --- | --- |")
            for i, line in enumerate(lines):
                field = _FIELD.match(line)
                if field:
                    label, ftype, fname, number, comment = field.groups()
                    shown = ftype.replace("<", "&lt;").replace(">", "&gt;")
                    out.append(
                        f"| {number} | `{fname}` | `{shown}` | {(label or '').strip()} | "
                        f"{_cell(comment or _comment_above(lines, i))} |"
                    )
            out.append("")
        else:
            values = re.findall(r"(\w+)\s*=\s*(\d+);", body)
            out.append(f"#### enum {name}\n\n" + ", ".join(f"`{v}` = {n}" for v, n in values) + "\n")
    out.append(f"### `{path.name}`, verbatim\n")
    out.append("```proto\n" + text.rstrip("\n") + "\n```\n")
    return out
