# SPDX-License-Identifier: Apache-2.0
"""The import structure of the pure-Python layer: no module of tensorplay
imports another one of tensorplay inside a function (an import cycle hidden
from the reader), except lazy loads listed here with their reason."""

import ast
import pathlib

import tensorplay

ROOT = pathlib.Path(tensorplay.__file__).parent

# (file, function, imported module) -> why it stays lazy
ALLOWED: dict = {
    # none left; an optional dependency loaded lazily would be listed here
}


def _module_of(path, node):
    if node.level == 0:
        return node.module
    package = list(path.relative_to(ROOT.parent).with_suffix("").parts)[:-node.level]
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
