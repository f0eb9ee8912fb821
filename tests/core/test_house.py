"""House rules over the source tree: no import cycle, no oversized module.

The import graph is built from the source with ``ast`` (nothing is imported): every
``import a.b`` and ``from .x import y`` of every module, relative and absolute, at module
level and inside functions, resolved to stepscope modules (``from pkg import name`` counts
as importing the submodule ``pkg.name`` when there is one, else ``pkg``). Imports under
``if TYPE_CHECKING:`` are left out: they never run. A cycle is a strongly connected
component of more than one module (or a module importing itself).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "stepscope"
# STYLE.md: modules under ~400 lines; this test fails above 450.
MAX_LINES = 450

# Exceptions, each with its reason; the test fails on an entry that no longer applies, so
# this list only shrinks. Empty: the house has no cycle and no module over the limit.
KNOWN_CYCLES: dict[frozenset[str], str] = {}
KNOWN_LONG: dict[str, str] = {}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node except those under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if (isinstance(node, ast.If) and isinstance(node.test, (ast.Name, ast.Attribute))
                and ast.unparse(node.test).endswith("TYPE_CHECKING")):
            for other in node.orelse:
                yield other
                yield from _runtime_nodes(other)
            continue
        yield node
        yield from _runtime_nodes(node)


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The stepscope modules ``name`` (in file ``path``) imports."""
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]  # the module's package
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    found.add(alias.name)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)
              and str(node.args[0].value).startswith(PACKAGE + ".")):
            found.add(str(node.args[0].value))  # a lazy load is an import all the same
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
    return {m for m in found if m in modules}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components with a cycle (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = set()
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.add(m)
                    if m == node:
                        break
                if len(comp) > 1 or node in graph[node]:
                    out.append(frozenset(comp))
    return out


def test_the_graph_sees_relative_absolute_and_function_local_imports() -> None:
    g = import_graph()
    assert "stepscope.errors" in g["stepscope._ranges"]  # from .errors import ...
    assert "stepscope.analysis.health.config" in g["stepscope.analysis.health.ranks"]
    assert "stepscope.report.terminal" in g["stepscope.cli.report"]  # inside report_cmd
    assert "stepscope.record.recorder" not in g["stepscope"]  # under TYPE_CHECKING only
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        frozenset({"a", "b", "c"})]
    assert cycles({"a": {"a"}, "b": set()}) == [frozenset({"a"})]


def test_no_import_cycles() -> None:
    found = set(cycles(import_graph()))
    new = [sorted(c) for c in found if c not in KNOWN_CYCLES]
    assert not new, f"import cycles: {new}"
    stale = [KNOWN_CYCLES[c] for c in KNOWN_CYCLES if c not in found]
    assert not stale, f"known cycles that are gone (remove them from KNOWN_CYCLES): {stale}"


def test_no_module_over_the_size_limit() -> None:
    sizes = {str(p.relative_to(SRC)): len(p.read_text(encoding="utf-8").splitlines())
             for p in _modules().values()}
    long = {p: n for p, n in sizes.items() if n > MAX_LINES and p not in KNOWN_LONG}
    assert not long, f"modules over {MAX_LINES} lines: {long}"
    stale = [p for p in KNOWN_LONG if sizes.get(p, 0) <= MAX_LINES]
    assert not stale, f"known long modules that are short now (remove from KNOWN_LONG): {stale}"
