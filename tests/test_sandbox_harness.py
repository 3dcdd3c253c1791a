"""The harness package (rewards/harness/) as the sandbox runs it: its modules joined into one `python -I -S -c`
program. What joining asks of the modules (the package docstring says why) is checked here on their source."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_pipeline.rewards import harness
from grpo_pipeline.rewards.harness import MODULES, program_source
from grpo_pipeline.tasks.core import python_ast

FOLDER = Path(harness.__file__).parent
MAX_ARG_STRLEN = 32 * 4096  # Linux: the longest single argument of execve (longer fails with E2BIG)


def tree(name: str) -> ast.Module:
    path = FOLDER / f"{name}.py"
    return python_ast.parse(path.read_text(), str(path))


def defined(module: ast.Module) -> set[str]:
    """Top-level names a module defines (functions, classes, assignments), not those it imports."""
    names: set[str] = set()
    for node in module.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names - {"TYPE_CHECKING"}


def test_every_module_of_the_package_is_joined() -> None:
    files = {p.stem for p in FOLDER.glob("*.py")} - {"__init__"}
    assert files == set(MODULES)


@pytest.mark.parametrize("name", ["__init__", *MODULES])
def test_the_package_imports_only_the_standard_library(name: str) -> None:
    """Anywhere in a module (functions included): standard-library modules, or a sibling of the package."""
    for node in ast.walk(tree(name)):
        if isinstance(node, ast.Import):
            tops = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            tops = [(node.module or "").split(".")[0]]
        elif isinstance(node, ast.ImportFrom):  # relative: only a sibling module of this package
            assert node.level == 1 and (node.module in MODULES or node.module is None), ast.unparse(node)
            continue
        else:
            continue
        assert all(t in sys.stdlib_module_names or t == "__future__" for t in tops), f"{name}: {ast.unparse(node)}"


@pytest.mark.parametrize("position", range(len(MODULES)))
def test_siblings_are_imported_at_the_top_and_only_from_earlier_modules(position: int) -> None:
    module = tree(MODULES[position])
    top = {id(n) for n in module.body}
    for node in ast.walk(module):
        if isinstance(node, ast.ImportFrom) and node.level:
            assert id(node) in top and node.module in MODULES[:position], ast.unparse(node)


def test_no_two_modules_define_the_same_name() -> None:
    """In the sandbox every module's names share one namespace, so one would silently replace another's."""
    seen: dict[str, str] = {}
    for name in MODULES:
        for defined_name in defined(tree(name)):
            assert defined_name not in seen, f"{defined_name} is defined in {seen.get(defined_name)} and {name}"
            seen[defined_name] = name


def test_module_state_is_rebound_only_in_its_own_module() -> None:
    """A `global` statement reaches its own module under import but every module in the joined program: state that
    several modules share must be set through its module's functions (wire.use_references), never rebound by name."""
    imported = {
        alias.name
        for name in MODULES
        for node in tree(name).body
        if isinstance(node, ast.ImportFrom) and node.level
        for alias in node.names
    }
    for name in MODULES:
        module = tree(name)
        for node in ast.walk(module):
            if isinstance(node, ast.Global):
                assert set(node.names) <= defined(module), f"{name} rebinds {node.names}"
                assert not set(node.names) & imported, f"{node.names} of {name} is imported elsewhere"


@pytest.mark.parametrize("name", ["__init__", *MODULES])
def test_functions_are_short(name: str) -> None:
    for node in ast.walk(tree(name)):
        if isinstance(node, ast.FunctionDef):
            assert node.end_lineno - node.lineno < 60, f"{name}.{node.name}: {node.end_lineno - node.lineno} lines"


def test_the_joined_program_is_one_module_that_fits_on_a_command_line() -> None:
    source = harness.source()
    assert len(source.encode()) < MAX_ARG_STRLEN
    joined = python_ast.parse(source)
    assert [ast.unparse(n) for n in ast.walk(joined) if isinstance(n, ast.ImportFrom) and n.level] == []
    futures = [n for n in joined.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    assert futures == [joined.body[0]]
    assert set().union(*(defined(tree(name)) for name in MODULES)) <= defined(joined)
    # the server starts last: its `if __name__ == "__main__"` ends the program
    last = joined.body[-1]
    assert isinstance(last, ast.If) and ast.unparse(last.test) == "__name__ == '__main__'"


def test_the_joined_program_loads_without_starting_a_server() -> None:
    """Run as a module of another name, the program only defines its names (and imports no `typing`)."""
    script = (
        f"import sys\nns = {{'__name__': 'harness'}}\nexec(compile({harness.source()!r}, 'harness', 'exec'), ns)\n"
        "print(ns['decode'](ns['encode']((1, [2.5], {'a': {3}}))), 'typing' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "(1, [2.5], {'a': {3}}) False", out.stderr


def test_a_sibling_imported_inside_a_function_cannot_be_joined(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text('"""A."""\n\nfrom __future__ import annotations\n\nX = 1\n')
    (tmp_path / "b.py").write_text("from .a import X\n\n\ndef f():\n    from .a import X\n\n    return X\n")
    with pytest.raises(ValueError, match="at the top"):
        program_source(tmp_path, ("a", "b"))
    (tmp_path / "b.py").write_text("from .a import X\n\nY = X + 1\n")
    assert program_source(tmp_path, ("a", "b")).split("\n") == [
        "from __future__ import annotations",
        "",
        "",
        "# ---------------------------------------------------------------- a.py",
        "",
        "",
        "X = 1",
        "",
        "",
        "# ---------------------------------------------------------------- b.py",
        "",
        "Y = X + 1",
        "",
    ]
