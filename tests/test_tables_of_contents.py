"""Each package's docstring is its table of contents: it names every module and subpackage the package holds."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("grpo_pipeline", "configs", "flows", "tasks", "rewards", "agents")
PACKAGES = sorted(init.parent for folder in FOLDERS for init in (ROOT / folder).rglob("__init__.py"))


def members(package: Path) -> dict[str, tuple[str, ...]]:
    """The package's modules and subpackages, each with the spellings a table of contents names it by: `name.py` or
    `name/`, or the name in backquotes."""
    modules = {p.stem: (f"{p.name}", f"`{p.stem}`") for p in sorted(package.glob("*.py")) if p.name != "__init__.py"}
    subpackages = {
        p.name: (f"{p.name}/", f"`{p.name}`") for p in sorted(package.iterdir()) if (p / "__init__.py").is_file()
    }
    return modules | subpackages


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_package_docstring_names_every_module(package: Path) -> None:
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    named = re.findall(r"(?<![\w/.])[\w.]+/?|`\w+`", doc)
    missing = [name for name, spellings in members(package).items() if not set(spellings) & set(named)]
    assert not missing, f"{package.relative_to(ROOT)}/__init__.py does not list {missing}: add a line for each"
