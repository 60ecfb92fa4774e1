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
