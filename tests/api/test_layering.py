# SPDX-License-Identifier: Apache-2.0
"""The import structure of the pure-Python layer: no module of tensorplay
imports another one of tensorplay inside a function (an import cycle hidden
from the reader), except lazy loads listed here with their reason; and the
module-level imports among the pure-Python modules form no cycle."""

import ast
import importlib.util
import pathlib

import tensorplay

ROOT = pathlib.Path(tensorplay.__file__).parent

# (file, function, imported module) -> why it stays lazy
ALLOWED: dict = {
    # none left; an optional dependency loaded lazily would be listed here
}


def _module_of(path, node, root=ROOT):
    """The absolute name of the module an ``ast.ImportFrom`` in ``path`` (a file
    of the package at ``root``) imports from."""
    if node.level == 0:
        return node.module
    package = list(path.relative_to(root.parent).with_suffix("").parts)[:-node.level]
    return ".".join(package + ([node.module] if node.module else []))


def function_level_imports():
    """(file, function, module) of every import of tensorplay inside a function."""
    found = set()
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom):
                    modules = [_module_of(path, node)]
                elif isinstance(node, ast.Import):
                    modules = [a.name for a in node.names]
                else:
                    continue
                for m in modules:
                    if m == "tensorplay" or m.startswith("tensorplay."):
                        found.add((path.relative_to(ROOT).as_posix(), fn.name, m))
    return found


def test_no_function_level_imports_within_tensorplay():
    found = function_level_imports()
    new = sorted(found - set(ALLOWED))
    assert not new, f"function-level imports of tensorplay modules (import at the top, or cut the cycle): {new}"
    gone = sorted(set(ALLOWED) - found)
    assert not gone, f"no longer imported inside a function, remove from ALLOWED: {gone}"


# ------------------------------------------------------------ module-level import cycles

def find_cycle(graph):
    """Return a cycle of ``graph`` ({node: successors}) as a path ``[a, b, ..., a]``, or None.

    Depth-first, in sorted order, so the same graph always reports the same cycle.
    """
    done, on_path, path = set(), set(), []

    def visit(node):
        on_path.add(node)
        path.append(node)
        for succ in sorted(graph.get(node, ())):
            if succ in on_path:
                return path[path.index(succ):] + [succ]
            if succ not in done:
                cycle = visit(succ)
                if cycle:
                    return cycle
        on_path.discard(node)
        path.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        if node not in done:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def _is_type_checking(test):
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _module_level_imports(tree):
    """The import statements that run when the module is imported: not those in
    functions, nor in the body of ``if TYPE_CHECKING:`` (class bodies run, so
    they count)."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))


def _is_importable_module(name):
    """True if ``name`` is a module (a compiled extension, say) that ``import`` finds."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _imports(path, root, pure, packages, is_module):
    """(module, line, of_name) for each module-level import in ``path``: the
    module imported, and with ``of_name`` a module a name is taken from (it
    must have run up to that name's definition)."""
    nodes = sorted(_module_level_imports(ast.parse(path.read_text(), str(path))),
                   key=lambda n: (n.lineno, n.col_offset))
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, False
            continue
        source = _module_of(path, node, root)
        yield source, node.lineno, False
        if source not in pure:
            continue                               # another package, or a compiled module's names
        for alias in node.names:
            sub = f"{source}.{alias.name}"
            if sub in pure:
                yield sub, node.lineno, False
            elif not (source in packages and alias.name != "*" and is_module(sub)):
                yield source, node.lineno, True    # a name (a compiled extension runs nothing more)


def import_graph(root=ROOT, is_module=_is_importable_module):
    """The module-level import graph of the pure-Python modules of the package at ``root``.

    Returns {module: {imported module: (file, line)}} over its .py files.
    Importing ``a.b.c`` runs the packages on the way (``a.b``) except the
    importer's own, which are running already; ``from P import X`` is an edge
    to the module ``P.X`` when that is a pure-Python one, none beyond P when
    ``P.X`` is a compiled extension (``is_module``), and to P itself when X is
    a name: P must have run up to its definition, even when P is the
    importer's own package.
    """
    pure, packages = {}, set()
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
            packages.add(".".join(parts))
        pure[".".join(parts)] = path
    graph = {}
    for module, path in pure.items():
        parts = module.split(".")
        running = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}   # itself and its packages
        file = path.relative_to(root.parent).as_posix()
        edges = graph[module] = {}
        for target, line, of_name in _imports(path, root, pure, packages, is_module):
            p = target.split(".")
            for m in (".".join(p[:i]) for i in range(1, len(p) + 1)):
                if m in pure and m != module and (m not in running or (of_name and m == target)):
                    edges.setdefault(m, (file, line))
    return graph


def _describe(graph, cycle):
    steps = [f"  {graph[a][b][0]}:{graph[a][b][1]}: {a} imports {b}" for a, b in zip(cycle, cycle[1:])]
    return " -> ".join(cycle) + "\n" + "\n".join(steps)


def test_find_cycle_reports_the_path():
    assert find_cycle({}) is None
    assert find_cycle({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}) is None      # a diamond
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"d"}, "d": {"e"}, "e": {"d"}}) == ["d", "e", "d"]
    assert find_cycle({"x": {"x"}}) == ["x", "x"]
    assert find_cycle({"a": {"z"}}) is None                                            # z: outside the graph


def test_import_graph_of_a_synthetic_package_finds_its_cycle(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from .a import f\nNAME = 1\n",
        "a.py": "from typing import TYPE_CHECKING\n"
                "from . import b, _ext\n"
                "if TYPE_CHECKING:\n    from .c import C\n"
                "else:\n    import pkg.sub\n"
                "def f():\n    from . import c\n",
        "b.py": "import os\nfrom . import NAME\n",              # a name of the package
        "c.py": "from .sub.d import y\nclass C:\n    from .a import f\n",
        "sub/__init__.py": "",
        "sub/d.py": "from .. import _ext\ny = 2\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = import_graph(pkg, is_module=lambda name: name == "pkg._ext")
    assert {m: set(e) for m, e in graph.items()} == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.b", "pkg.sub"},          # not c: under TYPE_CHECKING and in a function
        "pkg.b": {"pkg"},
        "pkg.c": {"pkg.sub", "pkg.sub.d", "pkg.a"},
        "pkg.sub": set(),
        "pkg.sub.d": set(),                     # _ext is compiled: pkg's own package, nothing to run
    }
    assert graph["pkg.b"]["pkg"] == ("pkg/b.py", 2)
    cycle = find_cycle(graph)
    assert cycle == ["pkg", "pkg.a", "pkg.b", "pkg"]
    assert _describe(graph, cycle).splitlines()[1:] == [
        "  pkg/__init__.py:1: pkg imports pkg.a",
        "  pkg/a.py:2: pkg.a imports pkg.b",
        "  pkg/b.py:2: pkg.b imports pkg",
    ]
    (pkg / "b.py").write_text("import os\n")                 # the cycle cut
    assert find_cycle(import_graph(pkg, is_module=lambda name: name == "pkg._ext")) is None


def test_no_module_level_import_cycle_within_tensorplay():
    graph = import_graph()
    assert "tensorplay._tensor.tensor" in graph["tensorplay"]              # the graph is not empty
    assert "tensorplay._tensor.tensor" in graph["tensorplay._tensor.interop"]
    assert not any("tensorplay._tensor.base" in e for e in graph.values())   # compiled: not a node
    cycle = find_cycle(graph)
    assert cycle is None, "module-level import cycle in tensorplay:\n" + _describe(graph, cycle)
