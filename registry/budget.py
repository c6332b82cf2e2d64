"""The budget gate: declared cost against the estimate, and totals against ``budget.yaml``.

A view is charged ``max(compute_cost, estimate)``: declaring less than it costs cannot make a
view fit. Each tier's (and each listed owner's) charged total must stay within its line of
``budget.yaml``; an overrun is an error with a table of the largest consumers. The optional
``state`` and ``online_memory`` lines (GiB per tier) bound the estimated state and Redis memory
(:func:`headwater.registry.cost.estimate_footprint`) the same way: a view that alone breaks its
tier's line is an error at the view, a tier whose views together break it is an error at the line.
"""

from __future__ import annotations

from collections import defaultdict

from headwater.registry.compiled import CheckResult, CompiledView
from headwater.registry.cost import (
    DEDUP_BUCKET_S,
    OVER_DECLARED_FACTOR,
    UNDER_DECLARED_FACTOR,
    CostEstimate,
    Footprint,
    estimate_footprint,
    format_bytes,
)
from headwater.registry.diagnostics import Diagnostic, Diagnostics, Severity
from headwater.registry.load import Located
from headwater.registry.models import BudgetFile, ViewDefinition
from headwater.registry.sources import resolve_timing

TOP_CONSUMERS = 5


def check_declared_cost(view: Located[ViewDefinition], estimate: CostEstimate, diags: Diagnostics) -> None:
    """Error when ``compute_cost`` is under-declared; warning when it is far above the estimate."""
    declared = view.spec.compute_cost
    est = estimate.cpu_hours_per_day
    file, line, name = view.file, view.line_of("compute_cost"), view.spec.feature_view
    if declared < UNDER_DECLARED_FACTOR * est:
        diags.add(
            Diagnostic(
                code="under-declared",
                message=f"compute_cost {declared:g} CPU-h/day is under-declared: the estimate is {est:.2f} "
                f"({declared / est:.0%} of it; the floor is {UNDER_DECLARED_FACTOR:.0%})",
                expected=f"compute_cost >= {UNDER_DECLARED_FACTOR * est:.2f} "
                f"(estimate: {estimate.explain()})",
                found=f"{declared:g}",
                hint=f"declare compute_cost: {est:.2f} or more, or cut the rate, windows or aggregations",
                file=file,
                line=line,
                view=name,
            )
        )
    elif est > 0 and declared > OVER_DECLARED_FACTOR * est:
        diags.add(
            Diagnostic(
                code="over-declared",
                severity=Severity.WARNING,
                message=f"compute_cost {declared:g} CPU-h/day is over {OVER_DECLARED_FACTOR:g}x the estimate "
                f"{est:.2f}: it holds budget the view will not use",
                expected=f"about {est:.2f}",
                found=f"{declared:g}",
                hint=f"lower compute_cost towards {est:.2f}",
                file=file,
                line=line,
                view=name,
            )
        )


def consumers_table(views: list[CompiledView], limit: int = TOP_CONSUMERS) -> str:
    """Render a text table of the ``limit`` views charged the most, largest first."""
    ranked = sorted(views, key=lambda v: v.charged_cost, reverse=True)[:limit]
    rows = [("view", "tier", "owner", "declared", "estimate", "charged", "file:line")]
    rows += [
        (
            v.name,
            v.tier,
            v.owner,
            f"{v.compute_cost:.2f}",
            f"{v.estimated_cost:.2f}",
            f"{v.charged_cost:.2f}",
            f"{v.file}:{v.line}",
        )
        for v in ranked
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    if len(views) > limit:
        lines.append(f"... and {len(views) - limit} more")
    return "largest consumers (CPU-h/day):\n" + "\n".join(lines)


def totals(views: list[CompiledView], key: str) -> dict[str, float]:
    """Charged CPU-h/day summed by ``key`` (``tier`` or ``owner``)."""
    sums: dict[str, float] = defaultdict(float)
    for view in views:
        sums[getattr(view, key)] += view.charged_cost
    return dict(sums)


def check_budget(views: list[CompiledView], budget: Located[BudgetFile], diags: Diagnostics) -> None:
    """One error per tier and per listed owner whose charged total exceeds its budget line."""
    spec = budget.spec
    tier_limits = {str(name): value for name, value in spec.tiers.items()}
    for tier, total in sorted(totals(views, "tier").items()):
        limit = tier_limits.get(tier)
        members = [v for v in views if v.tier == tier]
        if limit is None:
            diags.add(
                _over(
                    budget,
                    ("tiers",),
                    f"tier '{tier}' has no budget line",
                    "tier",
                    tier,
                    total,
                    None,
                    members,
                )
            )
        elif total > limit:
            diags.add(
                _over(
                    budget,
                    ("tiers", tier),
                    f"tier '{tier}' is over budget",
                    "tier",
                    tier,
                    total,
                    limit,
                    members,
                )
            )
    for owner, limit in sorted(spec.owners.items()):
        members = [v for v in views if v.owner == owner]
        total = sum(v.charged_cost for v in members)
        if total > limit:
            diags.add(
                _over(
                    budget,
                    ("owners", owner),
                    f"owner '{owner}' is over budget",
                    "owner",
                    owner,
                    total,
                    limit,
                    members,
                )
            )


def _over(
    budget: Located[BudgetFile],
    key: tuple[str, ...],
    message: str,
    kind: str,
    name: str,
    total: float,
    limit: float | None,
    members: list[CompiledView],
) -> Diagnostic:
    top = max(members, key=lambda v: v.charged_cost)
    found = f"{total:.2f} CPU-h/day charged by {len(members)} view(s)"
    if limit is None:
        expected = f"a line 'tiers: {{{name}: <CPU-h/day>}}' in budget.yaml"
        hint = f"add a budget line for {name} of at least {total:.2f}"
    else:
        expected = f"at most {limit:g} CPU-h/day"
        over = total - limit
        hint = (
            f"cut {over:.2f} CPU-h/day: the largest is '{top.name}' ({top.charged_cost:.2f} at {top.file}:"
            f"{top.line}); shorten its windows, drop aggregations, move it to a cheaper tier, or raise the "
            f"{kind} budget"
        )
    return Diagnostic(
        code="over-budget",
        message=f"{message}: {total:.2f} CPU-h/day" + (f" > {limit:g}" if limit is not None else ""),
        file=budget.file,
        line=budget.line_of(*key),
        expected=expected,
        found=found,
        hint=hint,
        detail=consumers_table(members),
    )


GIB = 1024**3
FOOTPRINTS = {"state": "state", "online_memory": "online memory"}


def view_footprint(view: CompiledView, result: CheckResult) -> Footprint | None:
    """Return the state and memory estimate of a checked view (``None`` when its source did not check)."""
    from headwater.registry.tiers import TIERS

    source = result.sources.get(view.source)
    if source is None:
        return None
    entities = result.budget.entities.get(view.entity) if result.budget else None
    key_field = source.schema.fields.get(view.join_key)
    key_bytes = 8 if key_field is not None and key_field.kind in ("int", "long") else 12
    rate = source.spec.expected_rate_per_s
    dedup_s = 0.0
    if view.tier == "nearline" and source.spec.event_id:
        timing = resolve_timing(source.spec)
        dedup_s = (timing.max_out_of_orderness_ms + timing.allowed_lateness_ms) / 1000 + DEDUP_BUCKET_S
    stream = (view.source, view.join_key)  # the measured profile of its entities (realtime state)
    rekeyed = view.join_key != source.spec.key  # nearline: a repartitioned leg with its own store
    return estimate_footprint(
        view.features, rate, TIERS[view.tier], entities, key_bytes, None, dedup_s, stream, rekeyed
    )


def check_footprints(result: CheckResult, budget: Located[BudgetFile], diags: Diagnostics) -> None:
    """Errors for views and tiers whose estimated state or online memory breaks ``budget.yaml``."""
    prints = {v.name: fp for v in result.views if (fp := view_footprint(v, result)) is not None}
    for key, words in FOOTPRINTS.items():
        limits: dict[str, float] = {str(t): g for t, g in getattr(budget.spec, key).items()}
        for tier, limit_gib in sorted(limits.items()):
            members = [v for v in result.views if v.tier == tier and v.name in prints]
            sized = sorted(((_bytes(prints[v.name], key), v) for v in members), key=lambda p: -p[0])
            limit = limit_gib * GIB
            for size, v in sized:
                if size > limit:
                    diags.add(_footprint_error(v, prints[v.name], key, words, size, limit_gib))
            total = sum(size for size, _ in sized)
            if total > limit and not any(size > limit for size, _ in sized):
                size, top = sized[0]
                diags.add(
                    Diagnostic(
                        code=f"over-{key.replace('_', '-')}",
                        message=f"tier '{tier}' is over its {words} budget: {format_bytes(total)} > "
                        f"{limit_gib:g} GiB",
                        file=budget.file,
                        line=budget.line_of(key, tier),
                        expected=f"at most {limit_gib:g} GiB of {words}",
                        found=f"{format_bytes(total)} estimated for {len(sized)} view(s)",
                        hint=f"the largest is '{top.name}' ({format_bytes(size)} at {top.file}:{top.line}); "
                        f"shorten its windows, coarsen its slides, drop features, or raise {key}.{tier}",
                        detail="\n".join(f"  {v.name}: {format_bytes(s)}" for s, v in sized[:TOP_CONSUMERS]),
                    )
                )


def _bytes(fp: Footprint, key: str) -> float:
    return fp.state_bytes if key == "state" else fp.online_bytes


def _footprint_error(
    view: CompiledView, fp: Footprint, key: str, words: str, size: float, limit_gib: float
) -> Diagnostic:
    basis = fp.state_basis if key == "state" else fp.online_basis
    entities = (
        ""
        if fp.entities_declared
        else " (entities not declared: every event a new key; declare budget.yaml entities)"
    )
    return Diagnostic(
        code=f"over-{key.replace('_', '-')}",
        message=f"view '{view.name}' alone needs {format_bytes(size)} of {words}, over the {view.tier} "
        f"budget of {limit_gib:g} GiB",
        file=view.file,
        line=view.line,
        view=view.name,
        expected=f"at most {limit_gib:g} GiB ({key}.{view.tier} in budget.yaml)",
        found=f"{format_bytes(size)} = {basis}{entities}",
        hint="shorten the windows or coarsen the slides (fewer live slices), drop features, "
        f"or raise {key}.{view.tier} in budget.yaml",
    )
