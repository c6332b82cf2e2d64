"""``headwater setup jars``: resolve the JVM jars the tiers need, once, with Maven.

The tiers never download at run time (no Ivy, no ``spark.jars.packages``): PyFlink and Spark are
handed the jars of one folder (:func:`headwater.registry.config.jvm_lib_dir`: ``$HEADWATER_JVM_LIB``,
``jvm_lib`` in headwater.yaml, a source checkout's ``infra/lib``, else ``~/.cache/headwater/lib``).
This command fills that folder from the Maven project headwater ships (the same ``pom.xml`` that
``make setup`` runs in a checkout): the Kafka broker, the Flink Kafka connector, Delta Lake, and
headwater's own Flink operator, compiled from its Java sources (so a JDK 17+ is needed, not just a
JRE). The project is copied to a temporary folder first, so an installed package is never written.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from headwater.registry import resources
from headwater.registry.errors import HeadwaterError

RESOLVED_MARK = ".resolved"
GROUPS = ("kafka", "flink", "flink-udfs", "delta")


class JarsError(HeadwaterError):
    """Maven is missing or failed; the message says what to install or where the log is."""


def build_jars(lib: Path, maven: str = "mvn", offline: bool = False, quiet: bool = True) -> list[Path]:
    """Run Maven on the shipped project so that ``lib/<group>/`` holds every group's jars.

    Returns the group folders. Raises JarsError when Maven is missing or fails.
    """
    exe = shutil.which(maven)
    if exe is None:
        msg = (
            f"Maven ({maven}) is not on PATH: install it with a JDK 17+ (Debian: apt-get install maven "
            "default-jdk-headless), "
            f"or copy the jars into {lib}/{{{','.join(GROUPS)}}}/ yourself and set HEADWATER_JVM_LIB"
        )
        raise JarsError(msg)
    project = resources.jvm_project()
    if not (project / "pom.xml").is_file():
        msg = f"{project / 'pom.xml'} is missing: this headwater install is incomplete; reinstall the wheel"
        raise JarsError(msg)
    lib = lib.resolve()
    lib.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="headwater-jvm-") as tmp:
        work = Path(tmp) / "project"
        # Only the project: the top pom and its modules (a checkout's infra/ also holds scripts and state).
        shutil.copytree(project / "maven", work / "maven", ignore=shutil.ignore_patterns("target"))
        shutil.copy2(project / "pom.xml", work / "pom.xml")
        # headwater.lib (the pom's output folder) is a property: the command line's value wins.
        cmd = [exe, "-B", "-f", str(work / "pom.xml"), f"-Dheadwater.lib={lib}", "package"]
        cmd[1:1] = ["-q"] if quiet else []
        cmd[1:1] = ["-o"] if offline else []
        done = subprocess.run(cmd, cwd=work, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
            msg = f"Maven failed (exit {done.returncode}): {' '.join(cmd)}\n{tail}"
            raise JarsError(msg)
    groups = [lib / group for group in GROUPS]
    missing = [str(g) for g in groups if not any(g.glob("*.jar"))]
    if missing:
        msg = f"Maven finished but left no jars in {', '.join(missing)}"
        raise JarsError(msg)
    (lib / RESOLVED_MARK).touch()
    return groups
