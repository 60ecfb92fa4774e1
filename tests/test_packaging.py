# SPDX-License-Identifier: Apache-2.0
"""The installed package is complete and clean (CPU: runs on CI against the
wheel that scripts/setup.sh built and installed)."""

import glob
import importlib.metadata
import os
import subprocess
import sys

import pytest

import tensorplay

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPILED = ["_cuda", "_stream", "_alloc", "_tensor", "_kernel", "_graph"]


def _installed_files():
    files = importlib.metadata.files("tensorplay") or []
    return {str(f).replace(os.sep, "/") for f in files}


def test_version_and_metadata():
    meta = importlib.metadata.metadata("tensorplay")
    assert tensorplay.__version__ == meta["Version"]
    assert meta["License-Expression"] == "Apache-2.0" or "Apache" in (meta.get("License") or "")
    assert any("Typing :: Typed" in c for c in meta.get_all("Classifier"))
    assert meta.get_all("Project-URL"), "package URLs are missing"


def test_the_wheel_holds_every_module_stub_and_marker():
    installed = _installed_files()
    if not any(f.startswith("tensorplay/") for f in installed):
        pytest.skip("tensorplay is not installed as a distribution here")
    source = {os.path.relpath(p, ROOT).replace(os.sep, "/")
              for p in glob.glob(os.path.join(ROOT, "tensorplay", "**", "*.py"), recursive=True)}
    missing = sorted(source - installed)
    assert not missing, f"source files not in the installed package: {missing}"
    for name in COMPILED:
        assert any(f.startswith(f"tensorplay/{name}.") and f.endswith(".so") for f in installed), name
        assert f"tensorplay/{name}.pyi" in installed, f"{name}.pyi missing"
    assert "tensorplay/py.typed" in installed


def test_the_package_under_test_is_the_installed_one():
    """The suite must test what users install, not the source folder."""
    src_dir = os.path.join(ROOT, "tensorplay")
    assert not os.path.abspath(tensorplay.__file__).startswith(src_dir + os.sep), (
        "tests import tensorplay from the source tree; run them from outside the repository root "
        "(pytest tests), against the installed package")


def test_auditwheel_finds_no_external_libraries():
    wheels = glob.glob(os.path.join(ROOT, "dist", "tensorplay-*.whl"))
    if not wheels:
        pytest.skip("no wheel in dist/ (scripts/setup.sh builds one)")
    try:
        out = subprocess.run([sys.executable, "-m", "auditwheel", "show", wheels[0]],
                             capture_output=True, text=True, timeout=300)
    except FileNotFoundError:
        pytest.skip("auditwheel is not installed")
    if out.returncode != 0 and "No module named auditwheel" in out.stderr:
        pytest.skip("auditwheel is not installed")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "manylinux" in text, text
    # the driver (libcuda) and NVRTC are found at run time by cuda-bindings, never linked
    assert "external shared libraries are required" not in text, text
    assert "libcuda" not in text and "libnvrtc" not in text, text


def test_sdist_holds_the_sources():
    sdists = glob.glob(os.path.join(ROOT, "dist", "tensorplay-*.tar.gz"))
    if not sdists:
        pytest.skip("no sdist in dist/ (scripts/setup.sh builds one)")
    import tarfile
    with tarfile.open(sdists[0]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for needed in ["pyproject.toml", "meson.build", "README.md", "LICENSE", "CHANGELOG.md",
                   *(f"src/tensorplay/{m}.pyx" for m in COMPILED),
                   *(f"src/tensorplay/{m}.pyi" for m in COMPILED)]:
        assert needed in names, needed


def test_show_config_names_the_versions(capsys):
    tensorplay.show_config()
    out = capsys.readouterr().out
    assert tensorplay.__version__ in out
    assert "cuda-bindings" in out and "nvrtc" in out
