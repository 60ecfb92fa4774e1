# SPDX-License-Identifier: Apache-2.0
"""The Sphinx documentation builds with warnings as errors (CPU: runs on CI),
and its offline intersphinx inventories are what docs/make_inventories.py writes."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")


def test_docs_build_without_warnings(tmp_path):
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_parser")
    if shutil.which("dot") is None:
        pytest.skip("Graphviz 'dot' is not installed (the debugging guide renders a DOT picture)")
    # the README's command, from the repository root: -P keeps the source
    # folder tensorplay/ off sys.path, so the installed package is documented
    out = subprocess.run([sys.executable, "-P", "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-q",
                          "docs", str(tmp_path / "html")], capture_output=True, text=True, cwd=ROOT,
                         timeout=900)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    html = (tmp_path / "html" / "api.html").read_text()
    for name in ("stage_and_launch", "begin_capture_to_while_node", "cudagraphify", "memory_reserved"):
        assert name in html, f"{name} missing from the API reference"
    assert "<svg" in (tmp_path / "html" / "guide" / "debugging.html").read_text() or \
        list((tmp_path / "html" / "_images").glob("graphviz-*.svg")), "the DOT picture was not rendered"


def test_offline_inventories_are_current(tmp_path):
    sys.path.insert(0, DOCS)
    try:
        import make_inventories
    finally:
        sys.path.remove(DOCS)
    for name, (project, entries) in make_inventories.TARGETS.items():
        with open(os.path.join(DOCS, "_inventories", f"{name}.inv"), "rb") as f:
            committed = f.read()
        make_inventories.HERE = str(tmp_path)
        os.makedirs(tmp_path / "_inventories", exist_ok=True)
        with open(make_inventories.write(name, project, entries), "rb") as f:
            assert f.read() == committed, f"docs/_inventories/{name}.inv is stale: run docs/make_inventories.py"
