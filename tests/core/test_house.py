"""House rules over the source tree: no import cycle, no upward arrow, no oversized module.

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
# The review rule: a module is one concept (STYLE.md: split by concept, not by size alone;
# ~400 lines is the usual size of one). Size alone fails only past this many lines, where
# no single concept fits any more.
MAX_LINES = 800

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


# -- layers --------------------------------------------------------------------------------
# The layers, lowest first, as module-name prefixes (the longest prefix decides: the
# run-directory door and the index sit above analysis, the rest of rundir/ below it).
# The rule: a module may import a module of its own layer or of a lower one; never of a
# higher one ("upward arrow"). Within a layer, record/ and rundir/ differ: the recorder
# writes through rundir.store, so rundir/ never imports record/ (PACKAGE_ARROWS).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("face", ("stepscope", "stepscope.errors", "stepscope.schema", "stepscope.findings",
              "stepscope.version", "stepscope._fastnp", "stepscope._ranges",
              "stepscope.plugs")),
    ("tools", ("stepscope.calc", "stepscope.traces", "stepscope.proc")),
    ("runs", ("stepscope.record", "stepscope.rundir")),
    ("analysis", ("stepscope.analysis",)),
    # The read door (may not exist yet) and the index, which summarises runs (analysis)
    # and is to read them through the door.
    ("door", ("stepscope.rundir.run", "stepscope.rundir.index")),
    ("views", ("stepscope.report", "stepscope.alerts")),
    ("apps", ("stepscope.integrations", "stepscope.launcher", "stepscope.demo")),
    ("cli", ("stepscope.cli", "stepscope.__main__")),
)
# (importer package, imported package): arrows forbidden inside a layer.
PACKAGE_ARROWS = {("stepscope.rundir", "stepscope.record")}
# Upward arrows that exist, each with its reason; the test fails on an entry that no
# longer applies, so this list only shrinks.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}
# Where a stepscope module may be named in a string and imported by that name: the
# package's lazy names and moved-path finder, and the plug board. A package's __init__
# may also load its own submodules by name (f"{__name__}.x": cli, analysis.health).
BY_NAME_ALLOWED = {"stepscope", "stepscope.plugs"}


def layer_of(module: str) -> int:
    best, best_len = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            hit = module == p or (p != PACKAGE and module.startswith(p + "."))
            if hit and len(p) > best_len:
                best, best_len = i, len(p)
    assert best >= 0, f"{module} is in no layer: add it to LAYERS"
    return best


def upward_arrows(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    out = set()
    for src, deps in graph.items():
        for dst in deps:
            if layer_of(dst) > layer_of(src):
                out.add((src, dst))
            elif any(src.startswith(a + ".") and dst.startswith(b + ".")
                     for a, b in PACKAGE_ARROWS):
                out.add((src, dst))
    return out


def by_name(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the stepscope modules it imports by a name held as data: a
    ``"module:attr"`` literal (a plug table), or an ``import_module`` argument that is a
    stepscope literal or an f-string. A package's ``__init__`` loading its own submodules
    (``f"{__name__}.x"``) is left out; so are plain module names used otherwise (package
    data: ``resources.files("stepscope.report")``; a run tag; ``python -m`` of itself)."""
    out: dict[str, set[str]] = {}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            found = None
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and node.value.partition(":")[2].isidentifier()
                    and node.value.partition(":")[0] in modules):
                found = node.value
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") ==
                  "import_module" and node.args):
                arg = node.args[0]
                if isinstance(arg, ast.JoinedStr):
                    found = ast.unparse(arg)
                    if "__name__" in found and path.name == "__init__.py":
                        continue
                elif (isinstance(arg, ast.Constant) and
                      str(arg.value).startswith(PACKAGE + ".")):
                    found = str(arg.value)
            if found is not None:
                out.setdefault(name, set()).add(found)
    return out


def test_the_layer_rule_sees_an_upward_arrow() -> None:
    assert upward_arrows({"stepscope.record.x": {"stepscope.alerts.monitor"},
                          "stepscope.alerts.monitor": {"stepscope.plugs"},
                          "stepscope.rundir.store": {"stepscope.record.conditions"},
                          "stepscope.rundir.index": {"stepscope.analysis.summary"},
                          "stepscope.plugs": set(), "stepscope.record.conditions": set(),
                          "stepscope.analysis.summary": set()}) == {
        ("stepscope.record.x", "stepscope.alerts.monitor"),
        ("stepscope.rundir.store", "stepscope.record.conditions")}


def test_no_upward_arrows() -> None:
    found = upward_arrows(import_graph())
    new = sorted(found - set(KNOWN_UPWARD))
    assert not new, f"upward imports (importer, imported): {new}"
    stale = [KNOWN_UPWARD[a] for a in KNOWN_UPWARD if a not in found]
    assert not stale, f"known upward arrows that are gone (remove from KNOWN_UPWARD): {stale}"


def test_stepscope_modules_are_imported_by_name_only_in_the_lazy_loaders_and_the_board(
        ) -> None:
    names = by_name(_modules())
    assert "stepscope.alerts.monitor:alerts_plug" in names["stepscope.plugs"]
    assert not {m: n for m, n in names.items() if m not in BY_NAME_ALLOWED}


def test_the_recorder_side_names_no_view_at_all() -> None:
    """Nothing in record/ mentions alerts/, report/ or cli/ in code, even as a string."""
    for path in sorted((SRC / PACKAGE / "record").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
                and isinstance(n.body[0], ast.Expr)}
        strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
                   and isinstance(n.value, str) and id(n) not in docs]
        bad = [s for s in strings if any(f"stepscope.{p}" in s
                                         for p in ("alerts", "report", "cli"))]
        assert not bad, f"{path.relative_to(SRC)} names {bad}"
