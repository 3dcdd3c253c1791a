"""Package discovery for the one `grpo_pipeline` namespace (the rest of the build config is in pyproject.toml).

pyproject.toml maps each design folder into the namespace (`[tool.setuptools.package-dir]`: configs/ ->
grpo_pipeline.configs, ...). `[tool.setuptools.packages.find]` cannot rename what it finds, so the packages below
each mapped folder are found here, from that mapping, and every new subpackage (a folder with an `__init__.py`)
is installed without being listed anywhere.
"""

import tomllib
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent
MAPPED = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]

packages = ["grpo_pipeline"]
for package, folder in MAPPED.items():
    packages += [package, *(f"{package}.{sub}" for sub in find_packages(str(ROOT / folder)))]

setup(packages=packages)
