"""Check one feature of a view: aggregation type rules, fields, ``where``, window and slide.

Each check appends a diagnostic located at the key concerned and goes on; the feature compiles
only when none of its checks failed.
"""

from __future__ import annotations

from dataclasses import dataclass

from headwater.registry.aggs import AGGS, dtype_accepts, output_dtype
from headwater.registry.avro import EventField, EventSchema
from headwater.registry.compiled import CompiledFeature, Operand
from headwater.registry.diagnostics import Diagnostic, Diagnostics
from headwater.registry.durations import Duration, format_seconds
from headwater.registry.expr import And, Expr, ExprError, parse
from headwater.registry.expr_check import check_expr, unknown_field
from headwater.registry.load import Located
from headwater.registry.models import FeatureDefinition, OperandDefinition, ViewDefinition
from headwater.registry.tiers import TIERS, Tier, tiers_keeping


@dataclass
class FeatureContext:
    """What a feature check needs to know about its view."""

    view: Located[ViewDefinition]
    index: int
    schema: EventSchema
    tier: Tier
    diagnostics: Diagnostics
    failed: bool = False

    @property
    def spec(self) -> FeatureDefinition:
        """The feature being checked."""
        return self.view.spec.features[self.index]

    def error(
        self,
        key: tuple[str | int, ...],
        code: str,
        message: str,
        *,
        expected: str | None = None,
        found: str | None = None,
        hint: str | None = None,
        detail: str | None = None,
    ) -> None:
        """Record an error at ``features[index].<key>``."""
        self.failed = True
        self.diagnostics.add(
            Diagnostic(
                code=code,
                message=message,
                file=self.view.file,
                line=self.view.line_of("features", self.index, *key),
                view=self.view.spec.feature_view,
                feature=self.spec.name,
                expected=expected,
                found=found,
                hint=hint,
                detail=detail,
            )
        )


def check_feature(ctx: FeatureContext) -> CompiledFeature | None:
    """Check ``ctx.spec``; the compiled feature, or None when any check failed."""
    spec = ctx.spec
    event_field = _check_field(ctx, ("field",), spec.agg, spec.field)
    _check_params(ctx)
    where = _parse_where(ctx, ("where",), spec.where)
    numerator = _operand(ctx, "numerator", spec.numerator, where, spec.where)
    denominator = _operand(ctx, "denominator", spec.denominator, where, spec.where)
    slide = _check_window(ctx)
    dtype = output_dtype(spec.agg, event_field)
    if spec.dtype is not None and not dtype_accepts(spec.dtype, dtype):
        ctx.error(
            ("dtype",),
            "bad-dtype",
            f"declared dtype '{spec.dtype}' cannot hold what {spec.agg} yields",
            expected=dtype,
            found=spec.dtype,
            hint=f"remove `dtype` (it is inferred as {dtype}) or declare {dtype}",
        )
    _check_expect(ctx, spec.dtype or dtype)
    if ctx.failed:
        return None
    return CompiledFeature(
        name=spec.name,
        agg=spec.agg,
        window=spec.window,
        slide=slide,
        dtype=spec.dtype or dtype,
        field=spec.field,
        k=spec.k,
        where=where,
        where_text=spec.where,
        numerator=numerator,
        denominator=denominator,
        description=spec.description,
        line=ctx.view.line_of("features", ctx.index),
        expect=spec.expect,
    )


def _check_expect(ctx: FeatureContext, dtype: str) -> None:
    """Refuse a range on dictionary ids (top_k slots, a string ``last``): it fits only numbers."""
    expect = ctx.spec.expect
    if expect is None or (expect.min is None and expect.max is None):
        return
    if ctx.spec.agg == "top_k" or dtype == "string":
        key = "min" if expect.min is not None else "max"
        ctx.error(
            ("expect", key),
            "bad-value",
            f"`expect.{key}` does not apply to a {ctx.spec.agg} of {dtype} values (dictionary ids)",
            expected="min/max only on numeric features",
            found=f"{ctx.spec.agg} ({dtype})",
            hint="remove min/max; max_missing_rate and max_drift_psi/max_drift_ks apply to any feature",
        )


def _check_field(ctx: FeatureContext, key: tuple[str, ...], agg: str, name: str | None) -> EventField | None:
    rule = AGGS[agg]
    if name is None:
        if rule.field == "required":
            ctx.error(
                key[:-1] or ("agg",),
                "missing-key",
                f"{agg} needs a `field`",
                expected=rule.kinds_text,
                found="no field",
                hint=f"add `field:` naming an event field ({ctx.schema.field_list()})",
            )
        return None
    if rule.field == "none":
        ctx.error(
            key,
            "bad-value",
            f"{agg} takes no `field`",
            expected=rule.kinds_text,
            found=name,
            hint="remove `field`",
        )
        return None
    event_field = ctx.schema.fields.get(name)
    if event_field is None:
        problem = unknown_field(name, 0, ctx.schema)
        ctx.error(
            key,
            "unknown-field",
            str(problem),
            expected=f"a field of {ctx.schema.path.name}",
            found=name,
            hint=problem.hint,
        )
        return None
    if event_field.kind not in rule.kinds:
        ctx.error(
            key,
            "agg-type",
            f"{agg} does not fit field '{name}' of type {event_field.describe()}",
            expected=rule.kinds_text,
            found=f"{name}: {event_field.describe()}",
            hint=_agg_hint(agg, event_field),
        )
    return event_field


def _agg_hint(agg: str, event_field: EventField) -> str:
    if event_field.kind in ("string", "enum"):
        return (
            f"use count, distinct_count, top_k or last on '{event_field.name}', or a numeric field for {agg}"
        )
    return f"pick a field of the right type, or an aggregation that accepts {event_field.kind}"


def _check_params(ctx: FeatureContext) -> None:
    spec = ctx.spec
    if spec.agg == "top_k" and spec.k is None:
        ctx.error(
            ("agg",),
            "missing-key",
            "top_k needs `k`",
            expected="k: the number of values kept (e.g. 5)",
            found="no k",
            hint="add `k: 5`",
        )
    if spec.agg != "top_k" and spec.k is not None:
        ctx.error(
            ("k",),
            "bad-value",
            f"`k` only applies to top_k, not {spec.agg}",
            expected="no k",
            found=str(spec.k),
            hint="remove `k`",
        )
    for side in ("numerator", "denominator"):
        given = getattr(spec, side) is not None
        if spec.agg == "ratio" and not given:
            ctx.error(
                ("agg",),
                "missing-key",
                f"ratio needs a `{side}`",
                expected=f"{side}: {{agg: count, where: ...}}",
                found=f"no {side}",
                hint=f"add `{side}:` with an aggregation",
            )
        if spec.agg != "ratio" and given:
            ctx.error(
                (side,),
                "bad-value",
                f"`{side}` only applies to ratio, not {spec.agg}",
                expected=f"no {side}",
                found=side,
                hint=f"remove `{side}` or use agg: ratio",
            )


def _parse_where(ctx: FeatureContext, key: tuple[str, ...], text: str | None) -> Expr | None:
    if text is None:
        return None
    try:
        expr = parse(text)
    except ExprError as exc:
        _where_error(ctx, key, text, exc)
        return None
    problems = check_expr(expr, ctx.schema)
    for problem in problems:
        _where_error(ctx, key, text, problem)
    return None if problems else expr


def _where_error(ctx: FeatureContext, key: tuple[str, ...], text: str, exc: ExprError) -> None:
    caret = f"where: {text}\n       {' ' * exc.pos}^"
    ctx.error(
        key,
        "bad-where",
        f"bad `where` filter: {exc}",
        expected="field op literal, field in (...), field is [not] null, joined by and/or/not",
        found=text,
        hint=exc.hint,
        detail=caret,
    )


def _operand(
    ctx: FeatureContext, side: str, spec: OperandDefinition | None, outer: Expr | None, outer_text: str | None
) -> Operand | None:
    if spec is None:
        return None
    if spec.agg not in ctx.tier.ratio_operands:
        ctx.error(
            (side, "agg"),
            "tier-cannot-run",
            f"the {ctx.tier.name} tier cannot divide a {spec.agg} in a ratio",
            expected=f"one of: {', '.join(sorted(ctx.tier.ratio_operands))}",
            found=spec.agg,
            hint="use another operand, or move the view to a tier that computes it "
            f"({', '.join(t.name for t in TIERS.values() if spec.agg in t.ratio_operands)})",
        )
    _check_field(ctx, (side, "field"), spec.agg, spec.field)
    own = _parse_where(ctx, (side, "where"), spec.where)
    parts = [e for e in (outer, own) if e is not None]
    where = None if not parts else parts[0] if len(parts) == 1 else And(tuple(parts))
    texts = [f"({t})" for t in (outer_text, spec.where) if t]
    return Operand(agg=spec.agg, field=spec.field, where=where, where_text=" and ".join(texts) or None)


def _check_window(ctx: FeatureContext) -> Duration:
    spec, tier, sla = ctx.spec, ctx.tier, ctx.view.spec.freshness_sla
    if spec.window.seconds > tier.max_window_s:
        keeping = [t for t in tiers_keeping(spec.window.seconds) if t != tier.name]
        ctx.error(
            ("window",),
            "window-too-long",
            f"window {spec.window} is longer than the {tier.name} tier keeps state for",
            expected=f"at most {format_seconds(tier.max_window_s)} on {tier.name}",
            found=str(spec.window),
            hint=f"shorten the window or move the view to {' or '.join(keeping) or 'another tier'}",
        )
    slide = spec.slide or Duration(min(tier.default_slide_s, spec.window.seconds))
    if spec.slide is None:
        return slide
    if slide.seconds > spec.window.seconds or round(spec.window.seconds * 1000) % round(slide.seconds * 1000):
        ctx.error(
            ("slide",),
            "bad-value",
            f"slide {slide} does not divide window {spec.window}",
            expected=f"a slide that divides {spec.window} evenly",
            found=str(slide),
            hint="pick a slide such that window / slide is a whole number",
        )
    if slide.seconds > sla.seconds:
        ctx.error(
            ("slide",),
            "sla-too-tight",
            f"slide {slide} updates values less often than the view's freshness_sla {sla}",
            expected=f"a slide of at most {sla}",
            found=str(slide),
            hint=f"shorten the slide to {sla} or less, or relax freshness_sla",
        )
    return slide
