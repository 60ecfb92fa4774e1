# SPDX-License-Identifier: Apache-2.0
"""The .pyi stubs beside the compiled modules agree with them (mypy's stubtest)."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("mypy")

MODULES = ["tensorplay._cuda", "tensorplay._stream", "tensorplay._alloc", "tensorplay._tensor",
           "tensorplay._kernel", "tensorplay._graph"]


def test_stubs_match_the_compiled_modules():
    allowlist = os.path.join(os.path.dirname(__file__), "stubtest-allowlist.txt")
    out = subprocess.run([sys.executable, "-m", "mypy.stubtest", "--ignore-disjoint-bases",
                          "--allowlist", allowlist, *MODULES],
                         capture_output=True, text=True, cwd="/", timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_examples_and_the_typing_file_pass_mypy_strict():
    """Users' code against the installed package's types: the examples and
    tests/typing/api_usage.py (assert_type on what mypy infers)."""
    targets = [os.path.join(ROOT, "examples"), os.path.join(ROOT, "tests", "typing", "api_usage.py")]
    out = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", *targets],
                         capture_output=True, text=True, cwd="/", timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_the_package_stub_is_generated_and_complete():
    """tensorplay/__init__.pyi is what scripts/gen_stubs.py writes from the op
    tables, and it declares every public name and every public Tensor attribute."""
    import ast

    import tensorplay
    gen = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_stubs.py"), "--check"],
                         capture_output=True, text=True, cwd="/", timeout=120)
    assert gen.returncode == 0, "tensorplay/__init__.pyi is stale: run python scripts/gen_stubs.py\n" + gen.stderr
    with open(os.path.join(ROOT, "tensorplay", "__init__.pyi")) as f:
        tree = ast.parse(f.read())
    top = set()
    tensor_attrs = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            top.add(node.target.id)
        elif isinstance(node, ast.Assign):
            top.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom):
            top.update(a.asname or a.name for a in node.names)
        if isinstance(node, ast.ClassDef) and node.name == "Tensor":
            tensor_attrs = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
    missing = sorted(set(tensorplay.__all__) - top)
    assert not missing, f"public names missing from the stub: {missing}"
    public = {n for n in dir(tensorplay.Tensor) if not n.startswith("_")}
    missing = sorted(public - tensor_attrs)
    assert not missing, f"Tensor attributes missing from the stub: {missing}"
