"""Map the top-level code folders into the one `headwater` namespace.

pyproject.toml holds the metadata; only the folder-to-package mapping lives here, because
it is computed: every sub-package found under registry/, pipelines/ and serving/ is
installed as headwater.<folder>.<sub>, so adding a sub-package needs no edit here.
"""

from setuptools import find_packages, setup

FOLDERS = ("registry", "pipelines", "serving")

packages: list[str] = []
package_dir: dict[str, str] = {}
for folder in FOLDERS:
    for name in find_packages(include=[folder, f"{folder}.*"]):
        packages.append(f"headwater.{name}")
        package_dir[f"headwater.{name}"] = name.replace(".", "/")

setup(packages=packages, package_dir=package_dir)
