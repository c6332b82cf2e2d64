"""``headwater alerts``: the Prometheus alerting rules of the feature repo, as a rules file."""

from __future__ import annotations

from pathlib import Path

import click

from headwater.cli.errors import HeadwaterCommand


@click.command("alerts", cls=HeadwaterCommand)
@click.option("--features", "features", type=click.Path(path_type=Path), default=None,
              help="The feature repo [default: headwater.yaml's].")  # fmt: skip
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Write the rules file here (rules/headwater.yml...) [default: stdout].")  # fmt: skip
def alerts(features: Path | None, out: Path | None) -> None:
    """Write Prometheus alerting rules generated from the feature repo.

    One freshness rule per view (p99 read-time age above its freshness_sla), one rule per
    feature `expect:` key over the gauges of `headwater monitor --metrics-file`, a stale-report
    rule, the version drift share above 0.1% and repair passes that keep finding missing keys.
    Load the file with Prometheus' `rule_files:`; `promtool check rules FILE` validates it.
    """
    from headwater.ranking.alerts import write_rules
    from headwater.registry.config import features_dir
    from headwater.registry.validate import check_repo

    registry = check_repo(features_dir(features))
    text = write_rules(registry, out)
    if out is None:
        click.echo(text, nl=False)
    else:
        click.echo(f"alerts: {text.count('- alert:')} rule(s) written to {out}")
