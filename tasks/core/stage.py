"""One key per stage, computed once: Prefect's cache key and the stage's output directory are the same hash.

A stage's key covers everything that can change its result:
  - its inputs: the config section and the fingerprinted artifacts (`Ref`s) it takes, as JSON;
  - the project code it runs: the code of its module and of every `grpo_pipeline` module that module imports,
    transitively, subpackages included (an edit to a reward or to the trainer scaffold reruns the stages that use
    it, and only those), plus the versions of the libraries that do the numerical work. Code, not prose: the
    docstrings, comments and field descriptions are left out, so a documentation edit reruns nothing;
  - what it reads from outside its arguments: the source of the user's own code it calls (the modules behind
    dotted-path rewards, `my_rewards:fn`), the content of a local base-model directory.

`@stage("folder")` turns a plain function `fn(..., out: Path)` into one that computes its key and output directory
`<run_dir>/<folder>/<key[:12]>` from its arguments, and exposes the same key to Prefect (`fn.stage.cache_key`),
so the two can never disagree.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import inspect
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from grpo_pipeline.configs.schema import UNKEYED, PipelineConfig, section_hash
from grpo_pipeline.tasks.core import python_ast

PACKAGE = "grpo_pipeline"
SUBPACKAGES = ("configs", "flows", "tasks", "rewards", "agents")
# The libraries whose version changes what a stage computes.
LIBRARIES = ("torch", "transformers", "trl", "tokenizers", "datasets", "accelerate", "math-verify", "peft")

R = TypeVar("R")


class RunContext(BaseModel):
    """What every training stage needs besides its own config section: where to write and how to name runs."""

    model_config = ConfigDict(frozen=True)

    run_dir: str
    experiment: str
    recipe: str
    seed: int
    # How training stages launch (configs/distributed.py DistributedConfig): how they run, not what they compute.
    # `num_processes` counts the processes that train together, accelerate's or Ray's workers (`backend`).
    num_processes: int = Field(default=1, json_schema_extra=UNKEYED)
    accelerate_config: str | None = Field(default=None, json_schema_extra=UNKEYED)
    backend: Literal["accelerate", "ray"] = Field(default="accelerate", json_schema_extra=UNKEYED)
    resources_per_worker: dict[str, float] = Field(default_factory=dict, json_schema_extra=UNKEYED)
    ray_address: str | None = Field(default=None, json_schema_extra=UNKEYED)

    @classmethod
    def of(cls, cfg: PipelineConfig) -> RunContext:
        """The run context of a whole pipeline config."""
        return cls(
            run_dir=cfg.run_dir,
            experiment=cfg.registry.experiment,
            recipe=cfg.name,
            seed=cfg.seed,
            num_processes=cfg.distributed.world_size,
            accelerate_config=cfg.distributed.accelerate_config,
            backend=cfg.distributed.backend,
            resources_per_worker=cfg.distributed.resources_per_worker,
            ray_address=cfg.distributed.ray_address,
        )


# ----------------------------------------------------------------------------- the project's code


@functools.cache
def package_modules() -> dict[str, Path]:
    """Every module of the installed `grpo_pipeline` namespace, subpackages included -> its source file."""
    modules: dict[str, Path] = {}
    for package in (PACKAGE, *(f"{PACKAGE}.{s}" for s in SUBPACKAGES)):
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(f"{package} is not installed; reinstall the project (make install)")
        for root in spec.submodule_search_locations:
            modules.update(_modules_under(package, Path(root)))
    return modules


def _modules_under(package: str, root: Path) -> dict[str, Path]:
    """The modules of the package at `root` and of its subpackages (folders with an `__init__.py`), recursively."""
    modules = {}
    for file in sorted(root.glob("*.py")):
        modules[package if file.stem == "__init__" else f"{package}.{file.stem}"] = file
    for sub in sorted(d for d in root.iterdir() if (d / "__init__.py").is_file()):
        modules.update(_modules_under(f"{package}.{sub.name}", sub))
    return modules


def _imported(module: str, file: Path, known: Mapping[str, Path]) -> set[str]:
    """The package's modules that `module` imports (absolute or relative, including `from pkg import submodule`)."""
    found: set[str] = set()
    for name in _import_names(file.read_text(), str(file), module, file.stem == "__init__"):
        # `import grpo_pipeline.tasks.sft` also runs the packages above it
        parts = name.split(".")
        found |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & known.keys()
    return found


@functools.cache  # by source text: every stage key of a run reads the same modules (an edit is new text)
def _import_names(source: str, filename: str, module: str, is_package: bool) -> tuple[str, ...]:
    """The dotted names a module's source imports, relative imports resolved."""
    found: list[str] = []
    for node in ast.walk(python_ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.split(".")
                parent = parent[: len(parent) - node.level + (1 if is_package else 0)]
                base = ".".join([*parent, base] if base else parent)
            names = [base, *(f"{base}.{a.name}" for a in node.names)]
        else:
            continue
        found += names
    return tuple(found)


def module_closure(module: str) -> set[str]:
    """`module` and every package module it imports, transitively."""
    known = package_modules()
    closure, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name in closure or name not in known:
            continue
        closure.add(name)
        todo.extend(_imported(name, known[name], known))
    return closure


@functools.cache
def code_version(module: str) -> str:
    """Hash of the code (not the prose, see `code_text`) of `module_closure(module)` and of the library versions."""
    known = package_modules()
    h = hashlib.sha256()
    for name in sorted(module_closure(module)):
        h.update(name.encode() + b"\0" + code_text(known[name]).encode() + b"\0")
    h.update(json.dumps(library_versions(), sort_keys=True).encode())
    return h.hexdigest()


# Keyword arguments that hold documentation: pydantic's `Field(description=...)`, typer's and argparse's `help=`.
PROSE_KEYWORDS = frozenset({"description", "help", "rich_help_panel"})


def code_text(file: Path) -> str:
    """The module's code without its prose: the dump of its AST (which holds no comments) with docstrings and
    the string values of `PROSE_KEYWORDS` arguments removed, so a documentation edit reruns no stage."""
    return _code_text(file.read_text(), str(file))


@functools.cache  # by source text, as `_import_names`: parsing is most of a cold run's key time
def _code_text(source: str, filename: str) -> str:
    return ast.dump(_Unprosed().visit(python_ast.parse(source, filename)))


class _Unprosed(ast.NodeTransformer):
    def generic_visit(self, node: ast.AST) -> ast.AST:
        body = getattr(node, "body", None)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and _is_text(first.value):
                node.body = body[1:] or [ast.Pass()]
        return super().generic_visit(node)

    def visit_keyword(self, node: ast.keyword) -> ast.keyword:
        if node.arg in PROSE_KEYWORDS and _is_text(node.value):
            return ast.keyword(arg=node.arg, value=ast.Constant(value=""))
        return self.generic_visit(node)


def _is_text(node: ast.expr) -> bool:
    """A string literal, possibly implicitly concatenated or joined with `+`."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and _is_text(node.left) and _is_text(node.right)


@functools.cache
def library_versions() -> dict[str, str]:
    versions = {}
    for lib in LIBRARIES:
        try:
            versions[lib] = version(lib)
        except PackageNotFoundError:
            versions[lib] = "absent"
    return versions


# ----------------------------------------------------------------------------- the user's code


def user_code(names: Iterable[str]) -> dict[str, str]:
    """`{dotted path: source fingerprint}` for the user-code paths among `names` (built-in names have no ':')."""
    return {n: user_code_fingerprint(n) for n in sorted(set(names)) if ":" in n}


def user_code_fingerprint(dotted: str) -> str:
    """Hash of the source behind a user's `module:attr` path (every .py file when the module is a package).

    A module that cannot be found keys as such; the stage itself then fails with the import error.
    """
    module = dotted.partition(":")[0]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None or not Path(spec.origin).is_file():
        return f"unresolved:{dotted}"
    origin = Path(spec.origin)
    files = sorted(origin.parent.rglob("*.py")) if origin.name == "__init__.py" else [origin]
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(origin.parent)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


# ----------------------------------------------------------------------------- the stage decorator


def context_of(params: Mapping[str, Any]) -> RunContext:
    """The run a stage belongs to: its `ctx` argument, or that of the one typed spec it takes instead (`spec`, e.g.
    a GRPO round's `GRPORound`)."""
    return params["ctx"] if "ctx" in params else params["spec"].ctx


@dataclass(frozen=True)
class StageSpec:
    """How one stage is keyed: its name, output folder (a format string over its arguments), the arguments left
    out of the key, and the fingerprints of what it reads from outside its arguments."""

    name: str
    folder: str
    module: str
    unkeyed: frozenset[str]
    external: Callable[[Mapping[str, Any]], Mapping[str, str]]

    def key(self, params: Mapping[str, Any]) -> str:
        keyed = {k: v for k, v in params.items() if k not in self.unkeyed}
        return section_hash(
            {"stage": self.name, "inputs": keyed, "code": code_version(self.module), "external": self.external(params)}
        )

    def out_dir(self, params: Mapping[str, Any]) -> Path:
        run_dir = params["run_dir"] if "run_dir" in params else context_of(params).run_dir
        return Path(run_dir) / self.folder.format(**params) / self.key(params)[:12]

    def cache_key(self, context: Any, params: Mapping[str, Any]) -> str:
        """Prefect's `cache_key_fn`."""
        return self.key(params)


def stage(
    folder: str | None = None,
    *,
    unkeyed: Iterable[str] = (),
    external: Callable[[Mapping[str, Any]], Mapping[str, str]] = lambda params: {},
) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Make `fn` a stage: callers leave out `out`, which is filled with the stage's keyed output directory.

    `unkeyed` names arguments that are recorded but do not change the result (e.g. tags to log); `external` maps
    the arguments to fingerprints of what the stage reads besides them (`user_code(...)` for the user's modules).
    A stage without an `out` parameter (it writes nothing of its own) is keyed all the same.
    """

    def deco(fn: Callable[..., R]) -> Callable[..., R]:
        sig = inspect.signature(fn)
        takes_out = "out" in sig.parameters
        public = sig.replace(parameters=[p for name, p in sig.parameters.items() if name != "out"])
        spec = StageSpec(fn.__name__, folder or fn.__name__, fn.__module__, frozenset(unkeyed), external)

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> R:
            bound = public.bind(*args, **kwargs)
            bound.apply_defaults()
            params = dict(bound.arguments)
            if takes_out:
                params["out"] = spec.out_dir(params)
            return fn(**params)

        run.__signature__ = public  # type: ignore[attr-defined]
        run.stage = spec  # type: ignore[attr-defined]
        return run

    return deco
