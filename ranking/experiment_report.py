"""``headwater experiment report``: each arm's CTR with a 95% interval over users, and the split's SRM test.

Steps:

1. Read the behaviour source's bronze table (Spark over Delta), keep the events whose ``arm`` is
   ``<experiment>/<arm>`` (the label the service writes on impressions and feedback), within
   ``--from``/``--to`` (UTC days of the event time), one row per ``event_id`` (a redelivery
   counts once).
2. Per arm and user: impressions and clicks; per arm: users with an impression (the unit the
   service assigns), the sums, and the moments the interval needs.
3. CTR = clicks / impressions, with the delta method's interval, the user as the unit
   (:func:`~headwater.ranking.experiment_stats.ratio_interval`): a user's impressions
   are not independent trials, so a per-impression (Wilson) interval would be too narrow.
4. Sample-ratio mismatch: a chi-square test of the users per arm against the arms' weights (from
   the serving config, ``--weights``, else equal). **Flagged** when an arm's share of the users
   differs from its weight's share by more than 0.5% of it (relative) *and* the p-value is under
   0.001 (so a deviation of chance on few users is not flagged, nor a tiny bias on many). The
   command exits 1 when flagged.

One experiment runs at a time (the serving config declares one ``experiment``): its arms pick each
request's model and funnel, which a second, layered experiment would pick as well.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import date
from typing import TYPE_CHECKING, Any

from headwater.ranking.experiment_stats import (
    SRM_MAX_DEVIATION,
    SRM_P_VALUE,
    RatioMoments,
    SampleRatio,
    ratio_interval,
    sample_ratio_test,
)
from headwater.registry.errors import HeadwaterError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from headwater.registry.plans import PlanSource

ARM_FIELD = "arm"
REPORT_FIELDS = (ARM_FIELD, "user_id", "event_type")


class ExperimentReportError(HeadwaterError, ValueError):
    """The report cannot be computed (no arm column, no such experiment, bad weights)."""


@dataclass(frozen=True)
class ArmCounts:
    """What landed for one arm: users with an impression, the sums, and the per-user moments."""

    users: int
    impressions: int
    clicks: int
    moments: RatioMoments | None = None
    """Over the users with an impression or a click (the interval's units); None: no interval."""


@dataclass(frozen=True)
class ArmFigures:
    """One arm's line of the report."""

    arm: str
    users: int
    impressions: int
    clicks: int
    ctr: float | None
    ctr_low: float | None
    ctr_high: float | None


@dataclass(frozen=True)
class ExperimentReport:
    """The whole report: arms, the SRM test and where the expected split came from."""

    experiment: str
    arms: list[ArmFigures]
    srm: SampleRatio
    weights_from: str

    def as_dict(self) -> dict[str, Any]:
        """Return plain JSON data."""
        return {
            "experiment": self.experiment,
            "weights_from": self.weights_from,
            "arms": [asdict(a) for a in self.arms],
            "srm": {
                **asdict(self.srm),
                "max_deviation": self.srm.max_deviation,
                "rule": f"flagged when max |deviation| > {SRM_MAX_DEVIATION:.1%} and p < {SRM_P_VALUE:g}",
            },
        }

    def text(self) -> str:
        """Return a table and the SRM verdict."""
        lines = [
            f"experiment {self.experiment} (expected split: {self.weights_from})",
            f"{'arm':<16}{'users':>9}{'impressions':>13}{'clicks':>9}{'CTR':>9}  95% CI (delta, per user)",
        ]
        for a in self.arms:
            ctr = "n/a" if a.ctr is None else f"{a.ctr:.2%}"
            ci = "n/a" if a.ctr_low is None else f"[{a.ctr_low:.2%}, {a.ctr_high or 0.0:.2%}]"
            lines.append(f"{a.arm:<16}{a.users:>9}{a.impressions:>13}{a.clicks:>9}{ctr:>9}  {ci}")
        s = self.srm
        shares = ", ".join(
            f"{arm} {s.observed_share[arm]:.2%} vs {s.expected_share[arm]:.2%} ({s.deviation[arm]:+.2%})"
            for arm in s.expected_share
        )
        lines.append(f"users per arm: {shares}")
        verdict = "FLAGGED" if s.flagged else "ok"
        lines.append(
            f"sample ratio: chi2 {s.chi_square:.3f} (df {s.df}), p {s.p_value:.3g}, max deviation"
            f" {s.max_deviation:.2%}: {verdict}"
            f" (flagged when > {SRM_MAX_DEVIATION:.1%} and p < {SRM_P_VALUE:g})"
        )
        return "\n".join(lines)

    def line(self) -> str:
        """Return one line: each arm's CTR and interval, and the SRM verdict (the demo prints it)."""
        arms = "; ".join(_arm_line(a) for a in self.arms)
        verdict = "FLAGGED" if self.srm.flagged else "ok"
        return (
            f"experiment {self.experiment}: {arms}; SRM p {self.srm.p_value:.3g},"
            f" max deviation {self.srm.max_deviation:.2%}: {verdict}"
        )


def _arm_line(a: ArmFigures) -> str:
    if a.ctr is None:
        return f"{a.arm} no impressions"
    if a.ctr_low is None or a.ctr_high is None:  # fewer than 2 users: no variance between users
        return f"{a.arm} CTR {a.ctr:.2%} of {a.impressions} impressions, {a.users} user(s): no interval"
    return (
        f"{a.arm} CTR {a.ctr:.2%} [{a.ctr_low:.2%}, {a.ctr_high:.2%}] of {a.impressions} impressions,"
        f" {a.users} users"
    )


def build_report(
    experiment: str, counts: Mapping[str, ArmCounts], weights: Mapping[str, float], weights_from: str
) -> ExperimentReport:
    """Compute CTRs, intervals and the SRM test from the per-arm ``counts``.

    Raises:
        ExperimentReportError: an arm landed that the weights do not name.
    """
    try:
        srm = sample_ratio_test({arm: c.users for arm, c in counts.items()}, weights)
    except ValueError as exc:
        raise ExperimentReportError(f"experiment {experiment!r}: {exc}") from exc
    arms = []
    for arm in weights:
        c = counts.get(arm, ArmCounts(0, 0, 0))
        ctr = c.clicks / c.impressions if c.impressions else None
        ci = ratio_interval(c.moments) if c.moments is not None else None
        arms.append(
            ArmFigures(
                arm, c.users, c.impressions, c.clicks, ctr, ci[0] if ci else None, ci[1] if ci else None
            )
        )
    return ExperimentReport(experiment, arms, srm, weights_from)


def arm_counts(
    bronze: DataFrame, source: PlanSource, experiment: str, lo: date | None, hi: date | None
) -> dict[str, ArmCounts]:
    """Count users, impressions and clicks per arm of ``experiment`` in ``source``'s bronze rows."""
    from pyspark.sql import functions as F

    from headwater.pipelines.offline.source_columns import PARTITION

    prefix = f"{experiment}/"
    rows = bronze.where(F.col(ARM_FIELD).startswith(prefix))
    if lo is not None:
        rows = rows.where(F.col(PARTITION) >= F.lit(lo.isoformat()).cast("date"))
    if hi is not None:
        rows = rows.where(F.col(PARTITION) <= F.lit(hi.isoformat()).cast("date"))
    if source.event_id:
        rows = rows.dropDuplicates([source.event_id])
    arm = F.substring(F.col(ARM_FIELD), len(prefix) + 1, 1_000)
    kind = F.col("event_type").cast("string")
    per_user = (
        rows.where(kind.isin("impression", "click"))
        .groupBy(arm.alias("arm"), F.col("user_id"))
        .agg(
            F.sum(F.when(kind == "impression", 1).otherwise(0)).cast("double").alias("i"),
            F.sum(F.when(kind == "click", 1).otherwise(0)).cast("double").alias("c"),
        )
    )
    grouped = per_user.groupBy("arm").agg(
        F.sum(F.when(F.col("i") > 0, 1).otherwise(0)).alias("users"),
        F.count(F.lit(1)).alias("units"),
        F.sum("i").alias("impressions"),
        F.sum("c").alias("clicks"),
        F.sum(F.col("c") * F.col("c")).alias("c2"),
        F.sum(F.col("i") * F.col("i")).alias("i2"),
        F.sum(F.col("c") * F.col("i")).alias("ci"),
    )
    out = {}
    for r in grouped.collect():
        moments = RatioMoments(int(r["units"]), float(r["clicks"]), float(r["impressions"]), float(r["c2"]),
                               float(r["i2"]), float(r["ci"]))  # fmt: skip
        out[r["arm"]] = ArmCounts(int(r["users"]), int(r["impressions"]), int(r["clicks"]), moments)
    return out


def experiments_landed(bronze: DataFrame) -> list[str]:
    """Return the experiment names found in the ``arm`` column."""
    from pyspark.sql import functions as F

    names = bronze.where(F.col(ARM_FIELD).contains("/")).select(
        F.substring_index(F.col(ARM_FIELD), "/", 1).alias("e")
    )
    return sorted(r["e"] for r in names.distinct().collect())


def report_source(sources: list[PlanSource], name: str | None) -> PlanSource:
    """Return the source with the report's fields (``name``, else the only one with them).

    Raises:
        ExperimentReportError: none or several sources fit, or ``name`` lacks a field.
    """
    fits = [s for s in sources if all(s.field(f) is not None for f in REPORT_FIELDS)]
    if name is not None:
        found = next((s for s in sources if s.name == name), None)
        if found is None or found not in fits:
            msg = f"source {name!r} is not in the applied plan with the fields {list(REPORT_FIELDS)}"
            raise ExperimentReportError(msg)
        return found
    if len(fits) != 1:
        msg = (
            f"{len(fits)} source(s) of the applied plan have the fields {list(REPORT_FIELDS)}"
            f" ({sorted(s.name for s in fits)}); apply the events schema with `arm` (version 2), or name"
            " the source with --source"
        )
        raise ExperimentReportError(msg)
    return fits[0]


def parse_weights(text: str) -> dict[str, float]:
    """Parse ``control=50,treatment=50``.

    Raises:
        ExperimentReportError: not ``arm=number`` pairs.
    """
    out: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = -1.0
        if not sep or not name.strip() or not weight > 0:
            msg = f"--weights: {part!r} is not arm=positive number (e.g. control=50,treatment=50)"
            raise ExperimentReportError(msg)
        out[name.strip()] = weight
    return out
