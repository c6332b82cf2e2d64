"""``headwater setup jars``: build the JVM jars with Maven."""

from __future__ import annotations

from pathlib import Path

import click

from headwater.cli.errors import HeadwaterGroup
from headwater.registry.config import jvm_lib_dir
from headwater.registry.jars import build_jars


@click.group(cls=HeadwaterGroup)
def setup() -> None:
    """One-time setup of what the tiers need besides Python packages."""


@setup.command()
@click.option(
    "--lib",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Target folder [default: $HEADWATER_JVM_LIB, jvm_lib in headwater.yaml, a checkout's "
    "infra/lib, else ~/.cache/headwater/lib]. Point HEADWATER_JVM_LIB (or jvm_lib) at it if you change it.",
)
@click.option("--maven", default="mvn", show_default=True, help="The Maven executable.")
@click.option("--offline", is_flag=True, help="Maven offline (-o): only what ~/.m2 already holds.")
@click.option("--verbose", is_flag=True, help="Show Maven's output.")
def jars(lib: Path | None, maven: str, offline: bool, verbose: bool) -> None:
    """Resolve and build the JVM jars of the tiers (Kafka, Flink connector, Delta, headwater's operator).

    Runs Maven (3.6+, with a JDK 17+) on the project shipped inside headwater; downloads go to
    ~/.m2 as usual. Run it once per machine (and after upgrading headwater).
    """
    target = lib if lib is not None else jvm_lib_dir()
    click.echo(f"resolving the JVM jars into {target} with Maven (a first run downloads ~270 MB to ~/.m2)")
    for group in build_jars(target, maven, offline, quiet=not verbose):
        click.echo(f"  {group}: {sum(1 for _ in group.glob('*.jar'))} jars")
    click.echo(f"done; the tiers find them at {target}")
