# SPDX-License-Identifier: Apache-2.0
"""The import structure of tensorplay, read from the sources: the pure-Python
modules (``tensorplay/**/*.py``, as installed) and the compiled ones
(``src/tensorplay/**/*.pyx`` and ``.pxd`` of the checkout the tests run from,
their ``cimport`` and ``import`` lines).

- Floors: every module sits on a floor (FLOORS, the layering of
  docs/design.md) and imports or cimports nothing above its own floor.
- No import cycle, typing-only imports (``if TYPE_CHECKING:``) and compiled
  modules included; and none at run time.
- No module imports another module's private names: ``from m import _x``
  where ``m._x`` is not a module, or ``alias._x`` on an imported module of
  tensorplay. Names shared inside the package have no leading underscore.
- No module imports another one of tensorplay inside a function (an import
  cycle hidden from the reader), except lazy loads listed in ALLOWED.

Each rule has a test on a small synthetic package showing that it can fail.
"""

import ast
import dataclasses
import functools
import importlib.util
import pathlib
import re

import tensorplay
from helpers import ROOT as REPO

ROOT = pathlib.Path(tensorplay.__file__).parent        # the pure-Python modules, as installed
SRC = REPO / "src" / "tensorplay"                      # the compiled modules' sources

# Floors, lowest first: a module imports only modules of its own floor or lower.
# A key names a module or a package (its modules with it); the longest key
# that matches a module gives its floor; "tensorplay" is the top __init__ alone.
FLOORS = {
    # 0 base
    "tensorplay._version": 0, "tensorplay._dtypes": 0, "tensorplay._device": 0, "tensorplay._frames": 0,
    # 1 driver: contexts, errors, streams, events, raw copies, kernel launch, DLPack C ABI
    "tensorplay._driver": 1,
    # 2 memory: allocator, backends, public memory functions, memory summary
    "tensorplay._memory": 2,
    # 3 tensor core and kernels
    "tensorplay._tensor": 3, "tensorplay._kernels": 3, "tensorplay.types": 3, "tensorplay.return_types": 3,
    # 4 ops, random, nn
    "tensorplay._ops": 4, "tensorplay._random": 4, "tensorplay.nn": 4,
    # 5 graph
    "tensorplay._graph": 5,
    # 6 facade: the public modules, and what uses only them
    "tensorplay": 6, "tensorplay.cuda": 6, "tensorplay.backends": 6, "tensorplay._config": 6,
    "tensorplay._stax": 6, "tensorplay.__main__": 6, "tensorplay._selfcheck": 6, "tensorplay._testing": 6,
}

# (file, function, imported module) -> why it stays lazy
ALLOWED: dict = {
    # none left; an optional dependency loaded lazily would be listed here
}


# ------------------------------------------------------------ reading the imports

@dataclasses.dataclass(frozen=True)
class Import:
    """One imported module of one statement of a source file."""
    line: int
    module: str            # absolute
    names: tuple           # ((name, asname), ...) of ``from module import``; () for ``import module``
    asname: str            # the name bound by ``import module as asname`` (None: the first component)
    where: str             # "top" (runs on import), "typing" (if TYPE_CHECKING:) or "function"
    function: str          # the enclosing function, for "function"
    cimport: bool


def _module_name(path, base):
    """``pkg.sub.mod`` of ``path`` (a file under ``base``/pkg); a package's __init__ is the package."""
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _absolute(path, base, level, module):
    """The absolute name of a ``from`` import's module, ``level`` dots relative to ``path``."""
    if level == 0:
        return module
    package = list(path.relative_to(base).with_suffix("").parts)[:-level]
    return ".".join(package + ([module] if module else []))


def _module_of(path, node, root=ROOT):
    """The absolute name of the module an ``ast.ImportFrom`` in ``path`` (a file
    of the package at ``root``) imports from."""
    return _absolute(path, root.parent, node.level, node.module)


def _is_type_checking(test):
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _py_imports(path, base):
    """The imports of a .py file: module level, under ``if TYPE_CHECKING:``
    (its ``else`` runs), in functions (class bodies run: module level)."""
    found = []

    def visit(node, where, function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, "function", function or child.name)
            elif isinstance(child, ast.Lambda):
                visit(child, "function", function or "<lambda>")
            elif isinstance(child, ast.If) and _is_type_checking(child.test) and where == "top":
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), "typing", None)
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), where, function)
            elif isinstance(child, ast.Import):
                for a in child.names:
                    found.append(Import(child.lineno, a.name, (), a.asname, where, function, False))
            elif isinstance(child, ast.ImportFrom):
                module = _absolute(path, base, child.level, child.module)
                names = tuple((a.name, a.asname) for a in child.names)
                found.append(Import(child.lineno, module, names, None, where, function, False))
            else:
                visit(child, where, function)

    visit(ast.parse(path.read_text(), str(path)), "top", None)
    return sorted(found, key=lambda i: i.line)


# Strings (their text could look like an import) and comments, blanked with their line breaks kept
_STRING_OR_COMMENT = re.compile(r'"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\'|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|#[^\n]*')
_FROM = re.compile(r"from\s+(\.*)([\w.]*)\s+(c?import)\s+(.*)$", re.S)
_PLAIN = re.compile(r"(c?import)\s+(.*)$", re.S)
_DEF = re.compile(r"(?:async\s+)?(?:c?p?def)\b[^(]*?(\w+)\s*\(")


def _cython_code(path):
    """The code of a .pyx or .pxd without strings and comments (line numbers kept)."""
    return _STRING_OR_COMMENT.sub(lambda m: "\n" * m.group().count("\n") if m.group()[0] != "#" else "",
                                  path.read_text())


def _statements(code):
    """(line, indent, text) of each logical line: bracketed and backslash continuations joined."""
    lines = code.splitlines()
    i = 0
    while i < len(lines):
        start, text = i, lines[i]
        while (text.count("(") > text.count(")") or text.rstrip().endswith("\\")) and i + 1 < len(lines):
            i += 1
            text = text.rstrip().rstrip("\\") + " " + lines[i]
        i += 1
        if text.strip():
            yield start + 1, len(text) - len(text.lstrip()), text.strip()


def _cython_imports(path, base):
    """The ``import``/``cimport`` statements of a .pyx or .pxd. An indented one
    is taken as inside a function (Cython has no ``if TYPE_CHECKING:``)."""
    found = []
    defs = []                                     # (indent, name) of the enclosing definitions
    for line, indent, text in _statements(_cython_code(path)):
        while defs and defs[-1][0] >= indent:
            defs.pop()
        d = _DEF.match(text)
        if d:
            defs.append((indent, d.group(1)))
            continue
        where = "function" if indent else "top"
        function = defs[0][1] if defs else None
        m = _FROM.match(text)
        if m:
            dots, module, kind, rest = m.groups()
            module = _absolute(path, base, len(dots), module or None)
            names = tuple((n.split()[0], n.split()[2] if len(n.split()) == 3 else None)
                          for n in (x.strip() for x in rest.strip().strip("()").split(",")) if n)
            found.append(Import(line, module, names, None, where, function, kind == "cimport"))
            continue
        m = _PLAIN.match(text)
        if m:
            kind, rest = m.groups()
            for item in (x.strip() for x in rest.split(",") if x.strip()):
                words = item.split()
                found.append(Import(line, words[0], (), words[2] if len(words) == 3 else None,
                                    where, function, kind == "cimport"))
    return found


def _stub_imports(path, base):
    """The imports of a type stub (.pyi): all for typing only."""
    return [dataclasses.replace(i, where="typing") for i in _py_imports(path, base) if i.where != "function"]


def source_files(root=ROOT, src=SRC):
    """(module, file shown in messages, path, imports) of every source file:
    the .py and the type stubs (.pyi, typing-only imports) under ``root``,
    the .pyx and .pxd under ``src`` (if given) with the stubs beside them
    that ``root`` lacks (a build in place installs none)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        out.append((_module_name(path, root.parent), path.relative_to(root.parent).as_posix(), path,
                    _py_imports(path, root.parent)))
    stubs = {}
    if src is not None:
        for path in sorted(src.rglob("*.pyi")):
            stubs[_module_name(path, src.parent)] = (path, src.parent, src.parent.parent)
    for path in sorted(root.rglob("*.pyi")):
        stubs[_module_name(path, root.parent)] = (path, root.parent, root.parent)
    for module, (path, base, shown) in sorted(stubs.items()):
        out.append((module, path.relative_to(shown).as_posix(), path, _stub_imports(path, base)))
    if src is not None:
        for path in sorted([*src.rglob("*.pyx"), *src.rglob("*.pxd")]):
            out.append((_module_name(path, src.parent), path.relative_to(src.parent.parent).as_posix(), path,
                        _cython_imports(path, src.parent)))
    return out


@functools.lru_cache(maxsize=None)
def _is_importable_module(name):
    """True if ``name`` is a module (a compiled extension, say) that ``import`` finds."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def known_modules(root=ROOT, src=SRC):
    """The module names of the package: its .py, its compiled modules (.pyx,
    and the .pyi and extensions installed), the modules generated at build
    time (.py.in), its packages."""
    names = {_module_name(p, root.parent) for p in root.rglob("*.py")}
    names |= {_module_name(p, root.parent) for p in root.rglob("*.pyi")}
    names |= {_module_name(p, root.parent).split(".cpython")[0] for p in root.rglob("*.so")}
    if src is not None:
        names |= {_module_name(p, src.parent) for p in src.rglob("*.pyx")}
        names |= {_module_name(p, src.parent).removesuffix(".py") for p in src.rglob("*.py.in")}
    return names


def _targets(imp, is_module):
    """The modules an import names: ``from P import X`` names ``P.X`` when that
    is a module, else P."""
    if not imp.names:
        return [imp.module]
    subs = [f"{imp.module}.{n}" for n, _ in imp.names if n != "*" and is_module(f"{imp.module}.{n}")]
    return subs + ([imp.module] if len(subs) < len(imp.names) else [])


def _within(name, package):
    return name == package or name.startswith(package + ".")


# ------------------------------------------------------------ floors

def floor_of(module, floors=FLOORS):
    """The floor of ``module``: its longest key in ``floors`` (the package name
    alone is only its own key); None if it has none."""
    top = min(floors, key=len)
    keys = [k for k in floors if _within(module, k) and (k != top or module == top)]
    return floors[max(keys, key=len)] if keys else None


def floor_violations(root=ROOT, src=SRC, floors=FLOORS, is_module=None):
    """Messages for each module without a floor, and each import of a module above the importer's floor."""
    package = root.name
    is_module = is_module or known_modules(root, src).__contains__
    bad = []
    for module, file, _, imports in source_files(root, src):
        own = floor_of(module, floors)
        if own is None:
            bad.append(f"{file}: {module} has no floor (add it to FLOORS and docs/design.md)")
            continue
        for imp in imports:
            for target in _targets(imp, is_module):
                if not _within(target, package):
                    continue
                floor = floor_of(target, floors)
                if floor is None or floor > own:
                    verb = "cimports" if imp.cimport else "imports"
                    bad.append(f"{file}:{imp.line}: {module} (floor {own}) {verb} {target} (floor {floor})")
    return sorted(set(bad))


def test_every_module_has_a_floor_and_imports_nothing_above_it():
    assert SRC.is_dir(), f"the compiled modules' sources are not at {SRC}"
    assert any(f.endswith(".pyx") for _, f, _, _ in source_files())
    bad = floor_violations()
    assert not bad, "imports above the importer's floor (see FLOORS):\n" + "\n".join(bad)


def test_floors_of_a_synthetic_package_are_enforced(tmp_path):
    root, src = tmp_path / "pkg", tmp_path / "src" / "pkg"
    _write(root, {
        "__init__.py": "from pkg.high import run\n",
        "low.py": "import os\nfrom pkg import base\n",                      # down: fine
        "base.py": "",
        "high.py": "from pkg.low import helper\n",                          # down: fine
        "sneaky.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.high import run\n",
        "lazy.py": "def f():\n    import pkg.high\n",
        "stray.py": "",
    })
    _write(src, {
        "core.pyx": '"""from pkg.high import run (a docstring)"""\nfrom libc.stdint cimport uintptr_t\n'
                    "from pkg.base cimport (x,\n    y)\nfrom pkg.high cimport thing\n",
        "core.pxd": "cimport pkg.low as low\n",
    })
    floors = {"pkg": 3, "pkg.base": 0, "pkg.low": 1, "pkg.core": 1, "pkg.sneaky": 1, "pkg.lazy": 1, "pkg.high": 2}
    assert floor_of("pkg.high.deep", floors) == 2 and floor_of("pkg.stray", floors) is None
    assert floor_of("pkg", floors) == 3
    assert floor_violations(root, src, floors, is_module=lambda n: False) == [
        "pkg/lazy.py:2: pkg.lazy (floor 1) imports pkg.high (floor 2)",
        "pkg/low.py:2: pkg.low (floor 1) imports pkg (floor 3)",            # base is no module here
        "pkg/sneaky.py:3: pkg.sneaky (floor 1) imports pkg.high (floor 2)",
        "pkg/stray.py: pkg.stray has no floor (add it to FLOORS and docs/design.md)",
        "src/pkg/core.pyx:5: pkg.core (floor 1) cimports pkg.high (floor 2)",
    ]
    known = known_modules(root, src)
    assert "pkg/low.py:2: pkg.low (floor 1) imports pkg (floor 3)" not in \
        floor_violations(root, src, floors, is_module=known.__contains__)  # from pkg import base: a module


def _write(base, files):
    for name, text in files.items():
        (base / name).parent.mkdir(parents=True, exist_ok=True)
        (base / name).write_text(text)


# ------------------------------------------------------------ private names

def _dunder(name):
    return name.startswith("__") and name.endswith("__")


def _private(name):
    return name.startswith("_") and not _dunder(name)


def _reaches_py(path, imports, is_module, package):
    """(line, module, name) of each ``alias._x`` on an imported module of ``package`` in a .py file."""
    aliases = _aliases(imports, is_module, package)
    found = []

    def resolve(node):
        """The module a chain of attributes on an alias names, or None; each
        private name reached on the way is recorded."""
        if isinstance(node, ast.Name):
            return aliases.get(node.id)
        if not isinstance(node, ast.Attribute):
            visit(node)
            return None
        base = resolve(node.value)
        if base is None:
            return None
        if is_module(f"{base}.{node.attr}"):
            return f"{base}.{node.attr}"
        if _private(node.attr):
            found.append((node.lineno, base, node.attr))
        return None

    def visit(node):
        if isinstance(node, ast.Attribute):
            resolve(node)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return sorted(set(found))


def _aliases(imports, is_module, package):
    """{name bound in the file: module of ``package``} of its imports."""
    aliases = {}
    for imp in imports:
        if not _within(imp.module, package):
            continue
        if not imp.names:
            if imp.asname:
                aliases[imp.asname] = imp.module
            else:
                aliases[imp.module.split(".")[0]] = imp.module.split(".")[0]
            continue
        for name, asname in imp.names:
            if name != "*" and is_module(f"{imp.module}.{name}"):
                aliases[asname or name] = f"{imp.module}.{name}"
    return aliases


_CHAIN = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\s*\.\s*\w+)+)")


def _reaches_cython(path, imports, is_module, package):
    """(line, module, name) of each ``alias._x`` on an imported module of ``package`` in a .pyx or .pxd."""
    aliases = _aliases(imports, is_module, package)
    found = []
    code = _cython_code(path)
    for m in _CHAIN.finditer(code):
        parts = [p.strip() for p in m.group(1).split(".")]
        base = aliases.get(parts[0])
        line = code.count("\n", 0, m.start()) + 1
        for attr in parts[1:]:
            if base is None:
                break
            if is_module(f"{base}.{attr}"):
                base = f"{base}.{attr}"
                continue
            if _private(attr):
                found.append((line, base, attr))
            break
    return sorted(set(found))


def private_name_imports(root=ROOT, src=SRC, is_module=None):
    """Messages for each import of another module's private name, and each reach ``alias._x``."""
    package = root.name
    is_module = is_module or known_modules(root, src).__contains__
    bad = []
    for module, file, path, imports in source_files(root, src):
        for imp in imports:
            if not _within(imp.module, package):
                continue
            for name, _ in imp.names:
                if _private(name) and not is_module(f"{imp.module}.{name}"):
                    bad.append(f"{file}:{imp.line}: {module} imports {imp.module}.{name}")
        reaches = _reaches_py if path.suffix == ".py" else _reaches_cython
        for line, target, name in reaches(path, imports, is_module, package):
            bad.append(f"{file}:{line}: {module} reaches {target}.{name}")
    return sorted(set(bad))


def test_no_module_imports_private_names_of_another():
    bad = private_name_imports()
    assert not bad, ("private names used by another module (drop the underscore of what the package "
                     "shares, or keep it inside its module):\n" + "\n".join(bad))


def test_private_names_of_a_synthetic_package_are_found(tmp_path):
    root, src = tmp_path / "pkg", tmp_path / "src" / "pkg"
    _write(root, {
        "__init__.py": "from pkg import _impl\nfrom pkg._impl import shared, __doc__\n",     # fine
        "_impl.py": "shared = 1\n_hidden = 2\n",
        "user.py": "import os\nimport pkg._impl as impl\nimport pkg\nfrom pkg._impl import _hidden\n"
                   "x = impl._hidden + impl.shared + os._exit.__name__\n"
                   "y = pkg._impl._hidden + pkg._impl.shared\n",
    })
    _write(src, {
        "fast.pyx": "from pkg._impl cimport _table\nfrom pkg cimport _impl as im\n"
                    "cdef int z = im._hidden + im.shared  # im._comment\n"
                    's = "im._in_a_string"\n',
    })
    assert private_name_imports(root, src, is_module=known_modules(root, src).__contains__) == [
        "pkg/user.py:4: pkg.user imports pkg._impl._hidden",
        "pkg/user.py:5: pkg.user reaches pkg._impl._hidden",
        "pkg/user.py:6: pkg.user reaches pkg._impl._hidden",
        "src/pkg/fast.pyx:1: pkg.fast imports pkg._impl._table",
        "src/pkg/fast.pyx:3: pkg.fast reaches pkg._impl._hidden",
    ]


# ------------------------------------------------------------ function-level imports

def function_level_imports(root=ROOT, src=SRC):
    """(file, function, module) of every import of the package inside a function."""
    package = root.name
    return {(file, imp.function, imp.module)
            for _, file, _, imports in source_files(root, src) for imp in imports
            if imp.where == "function" and _within(imp.module, package)}


def test_no_function_level_imports_within_tensorplay():
    found = function_level_imports()
    new = sorted(found - set(ALLOWED))
    assert not new, f"function-level imports of tensorplay modules (import at the top, or cut the cycle): {new}"
    gone = sorted(set(ALLOWED) - found)
    assert not gone, f"no longer imported inside a function, remove from ALLOWED: {gone}"


def test_function_level_imports_of_a_synthetic_package_are_found(tmp_path):
    root, src = tmp_path / "pkg", tmp_path / "src" / "pkg"
    _write(root, {
        "__init__.py": "import json\nfrom pkg import a\n",
        "a.py": "def f():\n    import os\n    from . import b\n"
                "class K:\n    from pkg import b\n    def m(self):\n        return lambda: __import__('x')\n",
        "b.py": "",
    })
    _write(src, {
        "c.pyx": "import pkg.b\n"
                 "cdef class C:\n    cdef int n\n    def get(self):\n"
                 "        from pkg.a import f\n        import threading\n        return f\n"
                 "cdef inline int helper(int x) except -1 nogil:\n    return x\n",
    })
    assert function_level_imports(root, src) == {("pkg/a.py", "f", "pkg"), ("src/pkg/c.pyx", "get", "pkg.a")}


# ------------------------------------------------------------ import cycles

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


def _imports(imports, pure, packages, is_module, typing):
    """(module, line, of_name) for each import that runs when the module is
    imported (with ``typing``, those under ``if TYPE_CHECKING:`` too): the
    module imported, and with ``of_name`` a module a name is taken from (it
    must have run up to that name's definition)."""
    for imp in imports:
        if imp.where == "function" or (imp.where == "typing" and not typing):
            continue
        if not imp.names:
            yield imp.module, imp.line, False
            continue
        source = imp.module
        yield source, imp.line, False
        if source not in pure:
            continue                               # another package, or a name of a compiled module
        for name, _ in imp.names:
            sub = f"{source}.{name}"
            if sub in pure:
                yield sub, imp.line, False
            elif not (source in packages and name != "*" and is_module(sub)):
                yield source, imp.line, True       # a name (a compiled extension runs nothing more)


def import_graph(root=ROOT, src=None, is_module=_is_importable_module, typing=False):
    """The import graph of the modules of the package at ``root`` (and of its
    compiled modules' sources at ``src``, if given): the imports that run when
    a module is imported, and with ``typing`` those under ``if TYPE_CHECKING:``.

    Returns {module: {imported module: (file, line)}}.
    Importing ``a.b.c`` runs the packages on the way (``a.b``) except the
    importer's own, which are running already; ``from P import X`` is an edge
    to the module ``P.X`` when that is a node, none beyond P when ``P.X`` is a
    compiled extension that is not (``is_module``), and to P itself when X is
    a name: P must have run up to its definition, even when P is the
    importer's own package. A .pyx and its .pxd are one node.
    """
    files = source_files(root, src)
    nodes = {}
    packages = set()
    for module, file, path, imports in files:
        if path.stem == "__init__" and path.suffix == ".py":
            packages.add(module)
        nodes.setdefault(module, []).append((file, imports))
    graph = {}
    for module, sources in nodes.items():
        parts = module.split(".")
        running = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}   # itself and its packages
        edges = graph.setdefault(module, {})
        for file, imports in sources:
            for target, line, of_name in _imports(imports, nodes, packages, is_module, typing):
                p = target.split(".")
                for m in (".".join(p[:i]) for i in range(1, len(p) + 1)):
                    if m in nodes and m != module and (m not in running or (of_name and m == target)):
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
    _write(pkg, {
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
    })
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
    typed = import_graph(pkg, is_module=lambda name: name == "pkg._ext", typing=True)
    assert set(typed["pkg.a"]) == {"pkg.b", "pkg.c", "pkg.sub"}                      # c: typing only
    assert find_cycle(typed) == ["pkg.a", "pkg.c", "pkg.a"]                           # c's class body


def test_import_graph_of_a_synthetic_package_with_compiled_modules_finds_their_cycle(tmp_path):
    root, src = tmp_path / "pkg", tmp_path / "src" / "pkg"
    _write(root, {"__init__.py": "", "py.py": "from pkg.low import f\n"})
    _write(src, {
        "__init__.pxd": "",
        "low.pyx": "from libc.stdint cimport uintptr_t\ndef f():\n    from pkg import py\n",
        "low.pxd": "cdef int g()\n",
        "mid.pyx": "from pkg.low cimport g\nimport pkg.py\n",
    })
    graph = import_graph(root, src, is_module=lambda name: False)
    assert {m: set(e) for m, e in graph.items()} == {
        "pkg": set(), "pkg.py": {"pkg.low"}, "pkg.low": set(), "pkg.mid": {"pkg.low", "pkg.py"}}
    assert find_cycle(graph) is None
    (src / "low.pxd").write_text("from pkg.mid cimport h\n")
    cycle = find_cycle(import_graph(root, src, is_module=lambda name: False))
    assert cycle == ["pkg.low", "pkg.mid", "pkg.low"]


def test_no_import_cycle_within_tensorplay():
    """At run time, and counting the typing-only imports and the compiled modules too."""
    is_module = known_modules().__contains__
    graph = import_graph(ROOT, SRC, is_module)
    assert "tensorplay._tensor.tensor" in graph["tensorplay"]              # the graph is not empty
    assert "tensorplay._tensor.tensor" in graph["tensorplay._tensor.interop"]
    assert "tensorplay._tensor.base" in graph                              # the compiled modules are nodes
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle in tensorplay at run time:\n" + _describe(graph, cycle)
    typed = import_graph(ROOT, SRC, is_module, typing=True)
    cycle = find_cycle(typed)
    assert cycle is None, "import cycle in tensorplay (typing-only imports counted):\n" + _describe(typed, cycle)
