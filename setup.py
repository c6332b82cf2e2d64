"""Map the top-level code folders into the one `headwater` namespace, and ship its data files.

pyproject.toml holds the metadata; only what is computed lives here:
- every sub-package found under registry/, pipelines/, ranking/, serving/, client/ and cli/ is installed as
  headwater.<folder>.<sub>, so adding a sub-package needs no edit here;
- the files that are not code but that an installed headwater needs are copied into the package:
  the example feature repo (features/ -> headwater/examples/features, the template of
  `headwater init`) and the Maven project of the JVM jars (infra/pom.xml, its modules and the
  Java sources of the realtime operator -> headwater/jvm, built by `headwater setup jars`).
  The folders stay where they are in the checkout (an editable install reads them there).
"""

from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

FOLDERS = ("registry", "pipelines", "ranking", "serving", "client", "cli")
DATA = {
    # target under headwater/: (source folder, glob patterns); MANIFEST.in lists the same for the sdist
    "examples/features": ("features", ("**/*.yaml", "**/*.yml", "**/*.avsc")),
    "jvm": ("infra", ("pom.xml", "maven/*/pom.xml", "maven/*/src/main/**/*")),
}

packages: list[str] = []
package_dir: dict[str, str] = {}
for folder in FOLDERS:
    for name in find_packages(include=[folder, f"{folder}.*"]):
        packages.append(f"headwater.{name}")
        package_dir[f"headwater.{name}"] = name.replace(".", "/")


class BuildWithData(build_py):
    """build_py, plus the DATA folders copied under headwater/ in the build (not for editable installs)."""

    def run(self) -> None:
        """Build the packages, then copy the data files (an editable install reads them in place)."""
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for target, (source, patterns) in DATA.items():
            base = Path(source)
            files = {p for pattern in patterns for p in base.glob(pattern) if p.is_file()}
            for path in sorted(files):
                rel = path.relative_to(base)
                if any(part.startswith(".") or part == "target" for part in rel.parts):
                    continue
                dest = Path(self.build_lib, "headwater", target, rel)
                self.mkpath(str(dest.parent))
                self.copy_file(str(path), str(dest))


setup(packages=packages, package_dir=package_dir, cmdclass={"build_py": BuildWithData})
