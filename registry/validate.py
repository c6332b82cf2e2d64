"""``check`` end to end: load, resolve references, check tiers and features, cost, budget.

Steps:
    1. Load every file (:mod:`headwater.registry.load`), keeping what validates.
    2. Check each source: its schema versions, keys, rules (:mod:`headwater.registry.sources`).
    3. For each view: unique name, known entity and source, join key in the event schema, SLA
       against the tier table, then each feature (:mod:`headwater.registry.validate_features`).
    4. Estimate each view's cost and compare it with the declared ``compute_cost``.
    5. Sum charged costs per tier and owner against ``budget.yaml``.
    6. Check the ``tier: on_demand`` views over the compiled ones
       (:mod:`headwater.registry.validate_on_demand`); they run in the service, on no tier's budget.
All findings are collected; nothing stops at the first error.
"""

from __future__ import annotations

import difflib
from dataclasses import replace
from pathlib import Path

from headwater.registry.budget import check_budget, check_declared_cost, check_footprints
from headwater.registry.compiled import CheckResult, CompiledFeature, CompiledSource, CompiledView
from headwater.registry.cost import estimate_view, job_share
from headwater.registry.diagnostics import Diagnostic, Diagnostics, Severity
from headwater.registry.durations import format_seconds
from headwater.registry.load import LoadedRepo, Located, load_repo
from headwater.registry.models import ViewDefinition
from headwater.registry.sources import KEY_KINDS, check_sources
from headwater.registry.tiers import TIERS, Tier, cheaper_tier_meeting
from headwater.registry.validate_features import FeatureContext, check_feature
from headwater.registry.validate_on_demand import check_on_demand


def check_repo(root: Path) -> CheckResult:
    """Run every check on the feature repo at ``root`` and return findings plus compiled views."""
    repo = load_repo(root)
    diags = repo.diagnostics
    result = CheckResult(root=root, diagnostics=diags, view_files=repo.view_files)
    result.entities = {name: loc.spec for name, loc in repo.entities.items()}
    result.sources = check_sources(repo.root, repo.sources, diags)
    result.budget = repo.budget.spec if repo.budget else None
    seen: dict[str, Located[ViewDefinition]] = {}
    for view in repo.views:
        name = view.spec.feature_view
        if name in seen:
            first = seen[name]
            diags.add(
                Diagnostic(
                    code="duplicate-name",
                    message=f"feature view '{name}' is defined twice",
                    file=view.file,
                    line=view.line_of("feature_view"),
                    view=name,
                    expected="one view per name across all files",
                    found=f"another definition at {first.file}:{first.line_of('feature_view')}",
                    hint="rename one of the views or delete the copy",
                )
            )
            continue
        seen[name] = view
        compiled = _check_view(view, repo, result, diags)
        if compiled is not None:
            result.views.append(compiled)
    if repo.budget is not None:
        check_budget(result.views, repo.budget, diags)
        check_footprints(result, repo.budget, diags)
    result.on_demand = check_on_demand(repo.on_demand, result.views, diags)
    return result


PLURAL = {"entity": "entities"}
"""Plurals that are not the singular + s, for messages (the file is ``entities.yaml``)."""


def _unknown(view: Located[ViewDefinition], key: str, kind: str, name: str, known: list[str]) -> Diagnostic:
    close = difflib.get_close_matches(name, known, n=1)
    kinds = PLURAL.get(kind, f"{kind}s")
    hint = f"did you mean '{close[0]}'?" if close else f"declare it in {kinds}.yaml"
    return Diagnostic(
        code=f"unknown-{kind}",
        message=f"unknown {kind} '{name}'",
        file=view.file,
        line=view.line_of(key),
        view=view.spec.feature_view,
        expected=f"one of: {', '.join(known) or f'(no {kinds} declared)'}",
        found=name,
        hint=hint,
    )


def _check_view(
    view: Located[ViewDefinition], repo: LoadedRepo, result: CheckResult, diags: Diagnostics
) -> CompiledView | None:
    spec = view.spec
    entity = result.entities.get(spec.entity)
    source = result.sources.get(spec.source)
    if entity is None:
        diags.add(_unknown(view, "entity", "entity", spec.entity, list(result.entities)))
    if source is None and spec.source not in repo.sources:
        diags.add(_unknown(view, "source", "source", spec.source, list(repo.sources)))
    tier = TIERS[spec.tier]
    _check_sla(view, tier, diags)
    if source is None:
        return None
    features = _check_features(view, source, tier, diags)
    if entity is None:
        return None
    key_field = source.schema.fields.get(entity.join_key)
    if key_field is None or key_field.kind not in KEY_KINDS:
        diags.add(
            Diagnostic(
                code="unknown-field",
                message=f"entity '{entity.name}' is keyed by "
                f"'{entity.join_key}', which events of source '{source.spec.name}' do not carry",
                file=view.file,
                line=view.line_of("entity"),
                view=spec.feature_view,
                expected=f"a string or integer field of {source.schema.path.name}",
                found=entity.join_key if key_field is None else f"{entity.join_key}: {key_field.describe()}",
                hint="key the entity by a string or integer event field, or use another source",
            )
        )
        return None
    if features is None:
        return None
    compiled = CompiledView(
        name=spec.feature_view,
        entity=entity.name,
        join_key=entity.join_key,
        source=source.spec.name,
        tier=spec.tier,
        freshness_sla=spec.freshness_sla,
        compute_cost=spec.compute_cost,
        owner=spec.owner,
        description=spec.description,
        features=features,
        file=view.file,
        line=view.line,
        tags=tuple(sorted(spec.tags.items())),
        late=spec.late,
    )
    if not _tier_runs(view, compiled, tier, diags):
        return None
    _warn_cheaper_tier(view, compiled, tier, diags)
    entities = result.budget.entities.get(entity.name) if result.budget else None
    rekeyed = entity.join_key != source.spec.key
    # the views of the repo sharing this view's job (tier, source) and group split its fixed cost
    share = job_share(((v.spec.tier, v.spec.source, v.spec.entity) for v in repo.views), spec.tier,
                      spec.source, spec.entity)  # fmt: skip
    estimate = estimate_view(features, source.spec.expected_rate_per_s, tier, rekeyed, entities, share=share)
    check_declared_cost(view, estimate, diags)
    return replace(compiled, estimated_cost=estimate.cpu_hours_per_day)


def _check_features(
    view: Located[ViewDefinition], source: CompiledSource, tier: Tier, diags: Diagnostics
) -> tuple[CompiledFeature, ...] | None:
    compiled: list[CompiledFeature] = []
    names: dict[str, int] = {}
    failed = False
    for index, feature in enumerate(view.spec.features):
        if feature.name in names:
            first = names[feature.name]
            diags.add(
                Diagnostic(
                    code="duplicate-name",
                    message=f"feature '{feature.name}' appears twice",
                    file=view.file,
                    line=view.line_of("features", index, "name"),
                    view=view.spec.feature_view,
                    feature=feature.name,
                    expected="unique feature names within a view",
                    found=f"also on line {first}",
                    hint="rename one of them",
                )
            )
            failed = True
            continue
        names[feature.name] = view.line_of("features", index, "name")
        ctx = FeatureContext(view=view, index=index, schema=source.schema, tier=tier, diagnostics=diags)
        result = check_feature(ctx)
        failed = failed or result is None
        if result is not None:
            compiled.append(result)
    return None if failed else tuple(compiled)


def _check_sla(view: Located[ViewDefinition], tier: Tier, diags: Diagnostics) -> None:
    sla = view.spec.freshness_sla
    if sla.seconds >= tier.freshness_floor_s:
        return
    faster = [t.name for t in TIERS.values() if t.freshness_floor_s <= sla.seconds]
    to_do = f"relax freshness_sla to at least {format_seconds(tier.freshness_floor_s)}"
    if faster:
        to_do += f", or move the view to tier {' or '.join(faster)}"
    diags.add(
        Diagnostic(
            code="sla-too-tight",
            message=f"freshness_sla {sla} is tighter than the {tier.name} tier can deliver",
            file=view.file,
            line=view.line_of("freshness_sla"),
            view=view.spec.feature_view,
            expected=f"at least {format_seconds(tier.freshness_floor_s)} on {tier.name}",
            found=str(sla),
            hint=to_do,
        )
    )


def _tier_runs(view: Located[ViewDefinition], compiled: CompiledView, tier: Tier, diags: Diagnostics) -> bool:
    """Whether ``tier`` can run the view as a whole (its features were checked one by one)."""
    slides = sorted({f.slide.seconds for f in compiled.features})
    if not tier.one_slide_per_view or len(slides) == 1:
        return True
    detail = ", ".join(f"{f.name}: {f.slide}" for f in compiled.features)
    diags.add(
        Diagnostic(
            code="tier-cannot-run",
            message=f"the {tier.name} tier publishes a view at one slide; its features slide at "
            f"{len(slides)} different steps",
            file=view.file,
            line=view.line_of("features"),
            view=compiled.name,
            expected="one `slide` shared by every feature of the view",
            found=detail,
            hint="give the features the same `slide`, or split the view in two",
        )
    )
    return False


def _warn_cheaper_tier(
    view: Located[ViewDefinition], compiled: CompiledView, tier: Tier, diags: Diagnostics
) -> None:
    sla = compiled.freshness_sla.seconds
    if sla < tier.freshness_floor_s:
        return
    cheaper = cheaper_tier_meeting(tier, sla, compiled.longest_window_s)
    if cheaper is None:
        return
    diags.add(
        Diagnostic(
            code="cheaper-tier",
            severity=Severity.WARNING,
            message=f"freshness_sla {compiled.freshness_sla} could be met by the cheaper {cheaper.name} tier",
            file=view.file,
            line=view.line_of("freshness_sla"),
            view=compiled.name,
            expected=f"an SLA below {format_seconds(cheaper.freshness_floor_s)} to need {tier.name}",
            found=str(compiled.freshness_sla),
            hint=f"move the view to tier: {cheaper.name} ({cheaper.describe()}), or tighten the SLA",
        )
    )
