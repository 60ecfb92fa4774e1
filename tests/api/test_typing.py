# SPDX-License-Identifier: Apache-2.0
"""The package's types agree with its code: mypy's stubtest over the whole
installed package (the .pyi beside each compiled module, the generated
tensorplay/__init__.pyi and tensorplay/_tensor/tensor.pyi, and the
pure-Python modules, which are their own stubs through their inline
annotations), mypy --strict on users' code, and the generated stubs are
current."""

import os
import pkgutil
import re
import subprocess
import sys

import pytest

from helpers import ROOT

pytest.importorskip("mypy")

HERE = os.path.dirname(os.path.abspath(__file__))


def _package_modules():
    import tensorplay
    names = {"tensorplay"}
    for info in pkgutil.walk_packages(tensorplay.__path__, "tensorplay."):
        names.add(info.name)
    return names


def test_stubtest_passes_over_the_whole_package():
    """stubtest checks every module of the installed package against its stub:
    mypy must type-check the package (tests/api/stubtest-mypy.ini), and each stub
    must match what the module holds at run time (names, signatures, types)."""
    out = subprocess.run([sys.executable, "-m", "mypy.stubtest", "--ignore-disjoint-bases",
                          "--mypy-config-file", os.path.join(HERE, "stubtest-mypy.ini"),
                          "--allowlist", os.path.join(HERE, "stubtest-allowlist.txt"), "tensorplay"],
                         capture_output=True, text=True, cwd="/", timeout=600)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    m = re.search(r"Success: no issues found in (\d+) modules", out.stdout)
    assert m, out.stdout[-2000:]
    assert int(m.group(1)) == len(_package_modules()), \
        f"stubtest checked {m.group(1)} modules, the package has {sorted(_package_modules())}"




def test_examples_and_the_typing_file_pass_mypy_strict():
    """Users' code against the installed package's types: the examples and
    tests/api/typing/api_usage.py (assert_type on what mypy infers)."""
    targets = [os.path.join(ROOT, "examples"), os.path.join(HERE, "typing")]
    out = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", *targets],
                         capture_output=True, text=True, cwd="/", timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_the_package_stubs_are_generated_and_complete():
    """tensorplay/__init__.pyi and tensorplay/_tensor/tensor.pyi are what
    scripts/gen_stubs.py writes from the op tables: the first declares every
    public name (Tensor re-exported from the second), the second every public
    Tensor attribute."""
    import ast

    import tensorplay
    gen = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_stubs.py"), "--check"],
                         capture_output=True, text=True, cwd="/", timeout=120)
    assert gen.returncode == 0, "a stub is stale: run python scripts/gen_stubs.py\n" + gen.stderr
    with open(os.path.join(ROOT, "tensorplay", "__init__.pyi")) as f:
        tree = ast.parse(f.read())
    top = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            top.add(node.target.id)
        elif isinstance(node, ast.Assign):
            top.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom):
            top.update(a.asname or a.name for a in node.names)
    missing = sorted(set(tensorplay.__all__) - top)
    assert not missing, f"public names missing from the stub: {missing}"
    with open(os.path.join(ROOT, "tensorplay", "_tensor", "tensor.pyi")) as f:
        tree = ast.parse(f.read())
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Tensor"]
    tensor_attrs = {n.name for n in classes[0].body if isinstance(n, ast.FunctionDef)} if classes else set()
    public = {n for n in dir(tensorplay.Tensor) if not n.startswith("_")}
    missing = sorted(public - tensor_attrs)
    assert not missing, f"Tensor attributes missing from the stub: {missing}"
