# SPDX-License-Identifier: Apache-2.0
"""Python started in a clone's root finds the source folder tensorplay/ (the
pure-Python half) before the installed package: the import must say so."""

import subprocess
import sys

from helpers import ROOT


def test_importing_the_source_folder_says_what_is_wrong(tmp_path):
    (tmp_path / "tensorplay").symlink_to(ROOT / "tensorplay", target_is_directory=True)
    res = subprocess.run([sys.executable, "-c", "import tensorplay; print(tensorplay.__file__)"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    if res.returncode == 0:
        # an editable install's finder comes before sys.path: the source folder hid nothing
        assert not res.stdout.strip().startswith(str(tmp_path)), res.stdout
        return
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: tensorplay's compiled modules are not here"), res.stderr
    assert "python -P" in last and "pip install ." in last
