"""The sandbox harness: the first (and only trusted) code that runs inside a sandbox. Standard library only.

Threat model. The host starts `python -I -S -c <the harness>` once per worker, its config on stdin (never in argv,
which every process can read); it runs a fork server that gets, for each program, three fds over its control
socket (SCM_RIGHTS):
  - spec fd (read): message 1 is the program, message 2 the tests and a nonce;
  - verdict fd (write): a "started" marker, then the result and its MAC (blake2b keyed with the nonce);
  - output fd: the program's stdout and stderr.
For each program the server forks a child, which closes every other fd, lowers its rlimits, drops to an
unprivileged uid when the server runs as root (and refuses to go on as root unless the host allowed it), becomes
non-dumpable, reads the program, forks, and only then reads the tests. The grandchild runs the program and answers
requests over its own pair of pipes (the call protocol); the child runs the tests in *its* process, where the
program's answers arrive as freshly decoded builtin and standard-library values or as handles. For stdin/stdout
tests the grandchild is instead a launcher that forks a fresh copy of the program per case and hands back its
stdout; it holds the inputs only. So the program never holds the tests, the expected values, the nonce or the
verdict fd, and nothing it does to its own process (sys.exit, atexit, SkipTest, an `__eq__` that is always True, a
redefined `check` or `set`, a tampered frame, a replaced `encode`) can change the count of passed tests, which only
the child keeps. What crosses is parsed by hand from a tagged text (no `eval`, no pickle), into fresh objects.
The program runs as `python prog.py` would run it, whatever the tests' style: its file `prog.py` in the working
directory, `__file__`, `sys.argv == ["prog.py"]` (stdio.py).

The modules, in the order the harness joins them (each says at its top what it does and what it trusts):
  values.py   standard-library values on the wire: carried as data, rebuilt as the library's own types
  wire.py     framing, `encode`/`decode`, the verdict's MAC (the host uses this module too)
  process.py  a clock, closing fds, waiting for a child
  stdio.py    the stdin/stdout launcher: a fresh copy of the program per case, run as `python prog.py`
  calls.py    the call protocol, and its program side (`serve_program`)
  channel.py  the call protocol's tests' side (`Channel`, `Handle`)
  compare.py  the stdout comparison rules, one per dataset's checker (`outputs_match`, `STDOUT_RULES`)
  checks.py   running the tests: `check(candidate)`, call cases, asserts, stdin/stdout cases; the verdict's payload
  server.py   the fork server, one child per program (rlimits, uid, non-dumpable), the clean-up between programs

How it is loaded, and why. The host joins the modules' sources into one program (`source()`, once per process, when
the first sandbox starts: each module without its docstring, its `from __future__` line and its imports of its
siblings, so that all their names share one namespace, as in one file) and passes it as the `-c` argument, as it
passed the one file before. The other way, the package on a read-only path inside the sandbox and a bootstrap that
imports it, was not taken:
  - start-up time: one source is compiled once, as before; importing nine modules costs a path search, stat calls
    and a read each, and a compile each where no bytecode cache can be written (a read-only mount). Without
    bubblewrap a server starts for every program, so that would be paid per program (benchmarks/stdio.py);
  - the threat model: the code the server runs is the text the host read when it imported this package and put
    on the command line. Nothing inside the sandbox is ever read as harness code, so no harness file or bytecode
    cache has to be mounted, kept unwritable by the program (which without bubblewrap may run as the host's own
    user) or put on a `sys.path` that the program's imports also search;
  - inside, the harness stays what it was: the `__main__` module, standard library only, `python -I -S`.
One argument may be at most MAX_ARG_STRLEN (128 KiB on Linux): the tests check that the program fits.

What joining asks of the modules (tests/test_sandbox_harness.py checks each): the standard library only; siblings
imported at the top only, as `from .module import name`, and only from a module earlier in `MODULES`; no top-level
name defined in two modules; and state that several modules share kept in one module behind functions (wire.py's
`use_references`/`references`): under import a `global` statement reaches only its own module, while in the
joined program it would reach everyone's. The host imports the package as usual: rewards/sandbox/ encodes the
server's config and each program's spec with wire.py and checks the verdict's MAC with it.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

# Imported so that every module is code of whoever imports this package (tasks/core/stage.py keys a stage by the
# modules it imports, and `SOURCE` reads files, which is no import): a change to server.py reruns the GRPO stage.
from . import calls, channel, checks, compare, process, server, stdio, values, wire  # noqa: F401

MODULES = ("values", "wire", "process", "stdio", "calls", "channel", "compare", "checks", "server")
HERE = Path(__file__).parent


def program_source(folder: Path = HERE, modules: tuple[str, ...] = MODULES) -> str:
    """The harness as one program: the `modules` of `folder` in order, each without the lines that only make sense
    in a package (`_standalone`), after one `from __future__ import annotations` for all."""
    parts = ["from __future__ import annotations\n"]
    for name in modules:
        path = folder / f"{name}.py"
        parts.append(f"\n\n# ---------------------------------------------------------------- {name}.py\n")
        parts.append(_standalone(path.read_text(), str(path)))
    return "".join(parts)


def _standalone(source: str, filename: str) -> str:
    """`source` without its docstring, its `from __future__` line and its imports of sibling modules (whose names
    the joined program already defines); raises ValueError for a sibling imported where it cannot be dropped."""
    tree = ast.parse(source, filename)
    top = {id(node) for node in tree.body}
    drop: set[int] = set()
    for i, node in enumerate(tree.body):
        docstring = i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        if docstring or _package_line(node):
            drop.update(range(node.lineno - 1, node.end_lineno or node.lineno))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level and (id(node) not in top or not node.module):
            raise ValueError(f"{filename}:{node.lineno}: import a sibling at the top, as `from .module import name`")
    lines = source.splitlines(keepends=True)
    return "".join(line for n, line in enumerate(lines) if n not in drop)


def _package_line(node: ast.stmt) -> bool:
    """A `from __future__` line or an import of a sibling (`from .wire import encode`)."""
    return isinstance(node, ast.ImportFrom) and (node.level > 0 or node.module == "__future__")


@functools.cache
def source() -> str:
    """The program the sandbox runs (`program_source()`), joined on first use: parsing the modules takes ~30 ms,
    which a process that never starts a sandbox need not pay."""
    return program_source()


__all__ = ["MODULES", "program_source", "source"]
