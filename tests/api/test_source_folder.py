# SPDX-License-Identifier: Apache-2.0
"""Python started in a clone's root finds the source folder tensorplay/ (the
pure-Python half) before the installed package. The source folder then loads
the installed package in its place, so that `python -c "import tensorplay"`
and `python -m tensorplay` work there; without an installed package the
import says what is wrong."""

import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT

_WHERE = """
import json, sys
import tensorplay
mods = {n: getattr(m, "__file__", None) for n, m in list(sys.modules.items()) if n.split(".")[0] == "tensorplay"}
print(json.dumps({"file": tensorplay.__file__, "value": tensorplay.tensor([1.0, 2.5]).tolist(),
                  "same": sys.modules["tensorplay"] is tensorplay, "modules": mods}))
"""


@pytest.fixture
def clone_root(tmp_path):
    """A folder holding the checkout's source folder tensorplay/, as a clone's root does."""
    (tmp_path / "tensorplay").symlink_to(ROOT / "tensorplay", target_is_directory=True)
    return tmp_path


def _run(args, cwd, without=(), **env):
    environ = {k: v for k, v in os.environ.items() if k not in without}
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=dict(environ, **env))


def test_importing_in_a_clone_root_loads_the_installed_package(clone_root):
    res = _run(["-c", _WHERE], clone_root, TENSORPLAY_DISABLE_CUDA="1")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["value"] == [1.0, 2.5] and out["same"]
    # every module of the package comes from the installed one (or an editable
    # install's finder, which comes before sys.path): none from the source folder
    for name, file in [("tensorplay", out["file"]), *out["modules"].items()]:
        assert file is None or not file.startswith(str(clone_root)), (name, file)


def test_python_m_tensorplay_in_a_clone_root(clone_root):
    res = _run(["-m", "tensorplay"], clone_root, TENSORPLAY_DISABLE_CUDA="1")
    assert res.returncode == 0, res.stderr
    rows = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in res.stdout.splitlines())}
    assert rows["tensorplay"] and rows["TENSORPLAY_DISABLE_CUDA"] == "1"
    assert "Self-check skipped" in res.stdout


def test_without_an_installed_package_the_import_says_what_is_wrong(clone_root):
    # -S: no site-packages, so no installed tensorplay (nor an editable install's finder);
    # nor one PYTHONPATH names (a build installed into a folder, as on a GPU machine)
    res = _run(["-S", "-c", "import tensorplay"], clone_root, without=("PYTHONPATH",))
    assert res.returncode != 0
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: tensorplay's compiled modules are not here"), res.stderr
    assert "no installed tensorplay" in last and "pip install ." in last and "scripts/setup.sh" in last
