"""Check ``tier: on_demand`` views: inputs, expressions, types, cycles, slot names.

Steps (every problem is reported, located at the YAML key concerned):
    1. Names: unique across all views; each feature's name is a new slot of the ranker's item-side
       vector (on-demand values are per (user, item) pair), so it must not repeat an item slot.
    2. Inputs: each ``view.feature`` names a user or item view (join key ``user_id``/``item_id``)
       and one of its features or slots, or a feature of another on-demand view.
    3. Expressions: they parse, every reference is an input (or ``request.<field>``), and they type
       (arithmetic on numbers, ids only through ``same``/``share_of``).
    4. Cycles: on-demand features that read each other must not loop; the views come out in an
       order where every input comes before its readers.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path

from headwater.registry.compiled import (
    CheckResult,
    CompiledOnDemandFeature,
    CompiledOnDemandView,
    CompiledView,
)
from headwater.registry.diagnostics import Diagnostic, Diagnostics
from headwater.registry.expr import ExprError
from headwater.registry.expr_value import (
    NUMBER,
    REQUEST,
    REQUEST_FIELDS,
    Ref,
    SlotType,
    Value,
    check_value,
    parse_value,
    refs_of,
)
from headwater.registry.load import Located
from headwater.registry.models import OnDemandViewDefinition
from headwater.registry.slots import feature_slots

RANKER_KEYS = ("user_id", "item_id")
"""Join keys of the views a ranking request has vectors for (the user's and the candidates')."""
OnDemandLoc = Located[OnDemandViewDefinition]


def slot_types(views: Iterable[CompiledView]) -> dict[str, SlotType]:
    """``view.slot`` and ``view.feature`` -> type, for every user and item view's online vector."""
    types: dict[str, SlotType] = {}
    for view in views:
        if view.join_key not in RANKER_KEYS:
            continue
        for f in view.features:
            slots = feature_slots(f.name, f.agg, f.k)
            if f.agg == "top_k":
                types[f"{view.name}.{f.name}"] = SlotType("top_k", f.field)
                for slot in slots:
                    kind = "id" if ".top" in slot else NUMBER
                    types[f"{view.name}.{slot}"] = SlotType(kind, f.field if kind == "id" else None)
            elif f.dtype == "string":
                types[f"{view.name}.{f.name}"] = SlotType("id", f.field)
            else:
                types[f"{view.name}.{f.name}"] = SlotType(NUMBER)
    return types


def check_on_demand(
    loaded: list[OnDemandLoc], views: list[CompiledView], diags: Diagnostics
) -> list[CompiledOnDemandView]:
    """Check every on-demand view; return the valid ones in evaluation order."""
    stored = slot_types(views)
    taken = {v.name: f"{v.file}:{v.line}" for v in views}
    item_slots = {s.split(".", 1)[1] for v in views if v.join_key == "item_id" for s in _slots_of(v)}
    od_features = {f"{v.spec.feature_view}.{f.name}" for v in loaded for f in v.spec.features}
    compiled: dict[str, CompiledOnDemandView] = {}
    reads: dict[str, set[str]] = {}
    slot_owner: dict[str, str] = {}
    for view in loaded:
        name = view.spec.feature_view
        if name in taken:
            _error(
                view,
                ("feature_view",),
                "duplicate-name",
                f"feature view '{name}' is defined twice",
                diags,
                expected="one view per name across all files",
                found=f"another at {taken[name]}",
                hint="rename one of the views",
            )
            continue
        taken[name] = f"{view.file}:{view.line}"
        inputs, inputs_ok = _check_inputs(view, stored, od_features, diags)
        result = _check_features(
            view, inputs, stored, set(stored) | od_features, item_slots, slot_owner, diags, reads
        )
        if inputs_ok and result is not None:
            compiled[name] = CompiledOnDemandView(
                name,
                tuple(view.spec.inputs),
                view.spec.owner,
                view.spec.description,
                result,
                view.file,
                view.line,
                tuple(sorted(view.spec.tags.items())),
            )
    return _ordered(loaded, compiled, reads, diags)


def _slots_of(view: CompiledView) -> list[str]:
    return [f"{view.name}.{s}" for f in view.features for s in feature_slots(f.name, f.agg, f.k)]


def _error(
    view: OnDemandLoc,
    key: tuple[str | int, ...],
    code: str,
    message: str,
    diags: Diagnostics,
    feature: str | None = None,
    **extra: str | None,
) -> None:
    diags.add(
        Diagnostic(
            code=code,
            message=message,
            file=view.file,
            line=view.line_of(*key),
            view=view.spec.feature_view,
            feature=feature,
            expected=extra.get("expected"),
            found=extra.get("found"),
            hint=extra.get("hint"),
        )
    )


def _check_inputs(
    view: OnDemandLoc, stored: dict[str, SlotType], od_features: set[str], diags: Diagnostics
) -> tuple[set[str], bool]:
    """Return the inputs that name a known feature, and whether every one did."""
    known = set(stored) | od_features
    good: set[str] = set()
    for index, text in enumerate(view.spec.inputs):
        if text in known:
            good.add(text)
            continue
        close = difflib.get_close_matches(text, sorted(known), n=1)
        _error(
            view,
            ("inputs", index),
            "unknown-input",
            f"input '{text}' is not a feature of a user or item view",
            diags,
            expected="view.feature of a view keyed by user_id or item_id, or of an on-demand view",
            found=text,
            hint=f"did you mean '{close[0]}'?" if close else "check the view and feature names",
        )
    return good, len(good) == len(set(view.spec.inputs))


def _check_features(
    view: OnDemandLoc,
    inputs: set[str],
    stored: dict[str, SlotType],
    known: set[str],
    item_slots: set[str],
    slot_owner: dict[str, str],
    diags: Diagnostics,
    reads: dict[str, set[str]],
) -> tuple[CompiledOnDemandFeature, ...] | None:
    out: list[CompiledOnDemandFeature] = []
    failed = False
    name = view.spec.feature_view
    for index, feature in enumerate(view.spec.features):
        key = ("features", index, "expression")
        where = f"{name}.{feature.name}"
        if feature.name in item_slots or feature.name in slot_owner:
            other = "an item view's slot" if feature.name in item_slots else f"'{slot_owner[feature.name]}'"
            _error(
                view,
                ("features", index, "name"),
                "duplicate-name",
                f"on-demand feature '{feature.name}' repeats the name of {other}",
                diags,
                feature.name,
                expected="a name no item view or other on-demand feature uses (it is a ranker input slot)",
                found=feature.name,
                hint="rename the feature",
            )
            failed = True
            continue
        slot_owner[feature.name] = where
        try:
            ast = parse_value(feature.expression)
        except ExprError as exc:
            _expr_error(view, key, feature.name, feature.expression, exc, diags)
            failed = True
            continue
        problems = _check_refs(ast, inputs, known, where)
        own = {r.name for r in refs_of(ast) if not r.name.startswith(REQUEST + ".") and r.name not in stored}
        reads[where] = own
        _, type_errors = check_value(ast, lambda ref: _type_of(ref, stored))
        for problem in problems + type_errors:
            _expr_error(view, key, feature.name, feature.expression, problem, diags)
        failed = failed or bool(problems or type_errors)
        line = view.line_of("features", index, "name")
        out.append(CompiledOnDemandFeature(feature.name, feature.expression, ast, feature.description, line))
    return None if failed else tuple(out)


def _check_refs(ast: Value, inputs: set[str], known: set[str], where: str) -> list[ExprError]:
    problems: list[ExprError] = []
    for ref in refs_of(ast):
        if ref.view == REQUEST:
            if ref.member not in REQUEST_FIELDS:
                msg = f"unknown request field '{ref.member}'"
                problems.append(ExprError(msg, ref.pos, f"use one of: {', '.join(REQUEST_FIELDS)}"))
            continue
        if ref.name == where:
            problems.append(ExprError(f"'{ref.name}' reads itself (a cycle)", ref.pos, "read other features"))
            continue
        if ref.name not in known:
            close = difflib.get_close_matches(ref.name, sorted(known), n=1)
            hint = f"did you mean '{close[0]}'?" if close else "name a slot of a user or item view"
            problems.append(ExprError(f"'{ref.name}' is no feature or slot of a known view", ref.pos, hint))
            continue
        if ref.view == where.split(".", 1)[0] or _covered(ref.name, inputs):  # own features need no input
            continue
        msg = f"'{ref.name}' is not one of the view's inputs"
        problems.append(ExprError(msg, ref.pos, f"add '{_feature_of(ref.name)}' to `inputs`"))
    return problems


def _covered(name: str, inputs: set[str]) -> bool:
    """Whether an input ``v.f`` covers ``v.f`` and its slots ``v.f.top1``, ``v.f.share1``..."""
    return name in inputs or _feature_of(name) in inputs


def _feature_of(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[:2])


def _type_of(ref: Ref, stored: dict[str, SlotType]) -> SlotType | None:
    """Return a stored slot's type; request fields and on-demand features are numbers (unknown: None)."""
    if ref.view == REQUEST:
        return SlotType(NUMBER) if ref.member in REQUEST_FIELDS else None
    return stored.get(ref.name, SlotType(NUMBER) if ref.name.count(".") == 1 else None)


def _expr_error(
    view: OnDemandLoc, key: tuple[str | int, ...], feature: str, text: str, exc: ExprError, diags: Diagnostics
) -> None:
    pointer = f"{text} (at position {exc.pos + 1})"
    _error(
        view,
        key,
        "bad-expression",
        str(exc),
        diags,
        feature,
        expected="an expression over the view's inputs (see registry/expr_value.py)",
        found=pointer,
        hint=exc.hint,
    )


def _ordered(
    loaded: list[OnDemandLoc],
    compiled: dict[str, CompiledOnDemandView],
    reads: dict[str, set[str]],
    diags: Diagnostics,
) -> list[CompiledOnDemandView]:
    """Return the views, inputs before readers; a cycle is an error on each of its members."""
    state: dict[str, int] = {}
    order: list[str] = []
    cyclic: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if state.get(node) == 2:
            return
        if state.get(node) == 1:
            loop = [*path[path.index(node) :], node]
            cyclic.update(loop)
            return
        state[node] = 1
        for dep in sorted(reads.get(node, ())):
            if dep in reads:
                visit(dep, [*path, node])
        state[node] = 2
        order.append(node)

    for node in sorted(reads):
        visit(node, [])
    by_view: dict[str, OnDemandLoc] = {}
    for v in loaded:  # the first of two views with one name is the one checked
        by_view.setdefault(v.spec.feature_view, v)
    for node in sorted(cyclic):
        view_name, feature = node.split(".", 1)
        view = by_view[view_name]
        index = next(i for i, f in enumerate(view.spec.features) if f.name == feature)
        loop = " -> ".join(sorted(cyclic))
        _error(
            view,
            ("features", index, "expression"),
            "cycle",
            f"on-demand feature '{node}' depends on itself through other features",
            diags,
            feature,
            expected="on-demand features that read each other without a loop",
            found=loop,
            hint="compute one of them from stored features only",
        )
        compiled.pop(view_name, None)
    rank = {node: i for i, node in enumerate(order)}
    views = list(compiled.values())
    return sorted(views, key=lambda v: (max(rank.get(f"{v.name}.{f.name}", 0) for f in v.features), v.name))


def plan_lines(result: CheckResult, state_dir: Path) -> list[str]:
    """Lines ``headwater plan`` prints for on-demand views, against the applied plan's.

    ``+`` new, ``!`` expressions changed (retrain the ranker), ``=`` unchanged, ``-`` removed.
    They run in the service, so no line carries a tier cost.
    """
    from headwater.registry.plans import plan_on_demand, read_plan

    try:
        applied = {v.name: v.version for v in read_plan(state_dir, "offline").on_demand}
    except (FileNotFoundError, ValueError):
        applied = {}
    lines = []
    current = {v.name: plan_on_demand(v) for v in result.on_demand}
    for name in sorted(set(applied) | set(current)):
        view = current.get(name)
        if view is None:
            lines.append(f"  - {name} [on_demand]: removed; models trained on its features need retraining")
            continue
        mark = "+" if name not in applied else ("=" if applied[name] == view.version else "!")
        lines.append(
            f"  {mark} {name} [on_demand] {view.version}: {len(view.features)} feature(s), {view.ops}"
            " vector ops per request in the service, 0 CPU-h/day on every tier"
        )
    return (["On-demand views (computed per request by the ranking service):", *lines]) if lines else []


def describe_on_demand(view: CompiledOnDemandView) -> list[str]:
    """Lines ``headwater features describe`` prints for an on-demand view."""
    lines = [
        f"{view.name}  ({view.file}:{view.line})\n  {view.description}",
        f"  tier on_demand: computed by the ranking service per (user, candidate, request),"
        f" owner {view.owner}; {view.ops} vector ops per request, 0 CPU-h/day on every tier",
        f"  inputs: {', '.join(view.inputs)}",
    ]
    lines += [f"  - {f.name} = {f.expression}" for f in view.features]
    return lines
