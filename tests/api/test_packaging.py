# SPDX-License-Identifier: Apache-2.0
"""The installed package is complete and clean (CPU: runs on CI against the
wheel that scripts/setup.sh built from the sdist, with build isolation, and
installed); the build finds its CUDA headers in the build environment only."""

import base64
import csv
import glob
import hashlib
import importlib.metadata
import io
import os
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile

import pytest
from packaging.requirements import Requirement

import tensorplay
from helpers import ROOT

# the compiled modules, as paths under src/tensorplay/ without suffix ("_graph/capture")
COMPILED = sorted(os.path.relpath(p, os.path.join(ROOT, "src", "tensorplay"))[:-len(".pyx")].replace(os.sep, "/")
                  for p in glob.glob(os.path.join(ROOT, "src", "tensorplay", "**", "*.pyx"), recursive=True))
DIST = "tensorplay-cuda13x"            # the distribution; the import name is tensorplay
DIST_FILE = DIST.replace("-", "_")     # its wheel and sdist file names
CUDA_CLASSIFIER = "Environment :: GPU :: NVIDIA CUDA :: 13"
FINDER = os.path.join(ROOT, "src", "find_cuda_headers.py")


def _pyproject():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def _pinned_minor(requirements, name):
    """The X.Y of the ``name==X.Y.*`` requirement in ``requirements``."""
    for text in requirements:
        req = Requirement(text)
        if req.name == name and not req.marker:
            m = re.fullmatch(r"==(\d+\.\d+)\.\*", str(req.specifier))
            assert m, f"{name} must be pinned as ==X.Y.*, not {req.specifier}"
            return m.group(1)
    raise AssertionError(f"no requirement on {name} in {requirements}")


def _build_minor():
    return _pinned_minor(_pyproject()["build-system"]["requires"], "cuda-bindings")


def _meson_version():
    with open(os.path.join(ROOT, "meson.build")) as f:
        m = re.search(r"project\((?:[^()]|\([^()]*\))*?version\s*:\s*'([^']+)'", f.read(), re.S)
    assert m, "meson.build's project() names no version"
    return m.group(1)


def _installed_files():
    files = importlib.metadata.files(DIST) or []
    return {str(f).replace(os.sep, "/") for f in files}


def _installed():
    try:
        return importlib.metadata.distribution(DIST)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"tensorplay is not installed as the distribution {DIST} here")


def _one(pattern, what):
    found = glob.glob(os.path.join(ROOT, "dist", pattern))
    if not found:
        pytest.skip(f"no {what} in dist/ (scripts/setup.sh builds one)")
    assert len(found) == 1, f"several {what}s in dist/: {found}"
    return found[0]


def _wheel():
    return _one(f"{DIST_FILE}-*.whl", "wheel")


def _sdist():
    return _one(f"{DIST_FILE}-*.tar.gz", "sdist")


def _wheel_metadata(wheel):
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        from email.parser import Parser
        return Parser().parsestr(z.read(name).decode())


# -- metadata of the installed distribution ---------------------------------

def test_the_import_name_comes_from_our_distribution():
    _installed()
    assert importlib.metadata.packages_distributions().get("tensorplay") == [DIST], (
        "another distribution also installs tensorplay/ (the unrelated 'tensorplay' on PyPI?)")


def test_version_and_metadata():
    meta = _installed().metadata
    assert meta["Name"] == DIST
    assert tensorplay.__version__ == meta["Version"]
    assert meta["License-Expression"] == "Apache-2.0" or "Apache" in (meta.get("License") or "")
    classifiers = meta.get_all("Classifier")
    assert "Typing :: Typed" in classifiers
    assert CUDA_CLASSIFIER in classifiers
    assert meta.get_all("Project-URL"), "package URLs are missing"


def test_one_version_string():
    """meson.build's project() holds the version; pyproject.toml takes it
    (dynamic) and tensorplay.__version__ comes from the file meson writes."""
    project = _pyproject()["project"]
    assert "version" not in project and "version" in project.get("dynamic", []), \
        "pyproject.toml must take the version from meson.build (dynamic = ['version'])"
    version = _meson_version()
    assert tensorplay.__version__ == version
    assert importlib.metadata.version(DIST) == version
    from tensorplay import _version
    assert _version.__version__ == version


def test_the_cuda_pins_agree():
    """Build: cuda-bindings and the CUDA headers of one minor; run time:
    cuda-bindings of that same minor (the compiled modules cimport its Cython
    layer, whose ABI may change between minors)."""
    pyproject = _pyproject()
    build = pyproject["build-system"]["requires"]
    minor = _pinned_minor(build, "cuda-bindings")
    assert _pinned_minor(build, "nvidia-cuda-runtime") == minor
    assert _pinned_minor(pyproject["project"]["dependencies"], "cuda-bindings") == minor
    installed = _installed().requires or []
    assert _pinned_minor(installed, "cuda-bindings") == minor, installed
    import cuda.bindings
    assert cuda.bindings.__version__.startswith(minor + "."), cuda.bindings.__version__


def test_the_readme_says_what_to_install():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    install = readme.split("## Install", 1)[1].split("\n## ", 1)[0]
    assert f"pip install {DIST}" in install
    assert "import tensorplay" in install or "`tensorplay`" in install
    assert f"{DIST_FILE}-" in install and ".tar.gz" in install, "the sdist install is not shown"
    assert "pip install ." in install, "the install from a clone is not shown"


# -- the files: installed, wheel, sdist ------------------------------------

def test_the_wheel_holds_every_module_stub_and_marker():
    _installed()
    installed = _installed_files()
    source = {os.path.relpath(p, ROOT).replace(os.sep, "/")
              for p in glob.glob(os.path.join(ROOT, "tensorplay", "**", "*.py"), recursive=True)}
    missing = sorted(source - installed)
    assert not missing, f"source files not in the installed package: {missing}"
    for name in COMPILED:
        assert any(f.startswith(f"tensorplay/{name}.") and f.endswith(".so") for f in installed), name
        assert f"tensorplay/{name}.pyi" in installed, f"{name}.pyi missing"
    assert "tensorplay/py.typed" in installed
    assert "tensorplay/_version.py" in installed


def test_the_package_under_test_is_the_installed_one():
    """The suite must test what users install, not the source folder."""
    src_dir = os.path.join(ROOT, "tensorplay")
    assert not os.path.abspath(tensorplay.__file__).startswith(src_dir + os.sep), (
        "tests import tensorplay from the source tree; run them from outside the repository root "
        "(pytest tests), against the installed package")


def test_the_installed_package_is_the_wheel_in_dist():
    wheel = _wheel()
    dist = _installed()
    with zipfile.ZipFile(wheel) as z:
        record = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        in_wheel = {row[0]: row[1] for row in csv.reader(io.StringIO(z.read(record).decode())) if row}
    in_venv = {str(f).replace(os.sep, "/"): f.hash for f in dist.files or []}
    compiled = [p for p in in_wheel if p.startswith("tensorplay/") and p.endswith(".so")]
    assert len(compiled) == len(COMPILED), compiled
    for path in compiled + ["tensorplay/__init__.py", "tensorplay/_version.py"]:
        assert path in in_venv, path
        h = in_venv[path]
        assert h is not None and f"{h.mode}={h.value}" == in_wheel[path], f"{path} differs from {wheel}"
    with open(dist.locate_file(compiled[0]), "rb") as f:
        digest = base64.urlsafe_b64encode(hashlib.sha256(f.read()).digest()).rstrip(b"=").decode()
    assert in_wheel[compiled[0]] == f"sha256={digest}"


def test_the_wheel_metadata():
    meta = _wheel_metadata(_wheel())
    assert meta["Name"] == DIST
    assert meta["Version"] == _meson_version()
    assert CUDA_CLASSIFIER in meta.get_all("Classifier")
    minor = _build_minor()
    assert _pinned_minor(meta.get_all("Requires-Dist"), "cuda-bindings") == minor
    assert os.path.basename(_wheel()).startswith(f"{DIST_FILE}-{_meson_version()}-")


def test_the_wheel_grafts_no_nvidia_library():
    """The driver, NVRTC and cuBLAS are found at run time, never shipped."""
    wheel = _wheel()
    assert "manylinux" in os.path.basename(wheel), "the wheel was not repaired (auditwheel repair)"
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    grafted = [n for n in names if re.search(r"lib(cuda|nvrtc|cublas|cudart)[^/]*\.so", n)]
    assert not grafted, grafted
    assert all(n.startswith(("tensorplay/", f"{DIST_FILE}-")) for n in names), \
        sorted({n.split("/")[0] for n in names})


def test_auditwheel_finds_no_external_libraries():
    wheel = _wheel()
    try:
        out = subprocess.run([sys.executable, "-m", "auditwheel", "show", wheel],
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


def test_the_repair_step_is_cibuildwheels():
    """scripts/setup.sh runs [tool.cibuildwheel.linux]'s repair command, which
    keeps the NVIDIA libraries loaded at run time out; both build with pip."""
    cibw = _pyproject()["tool"]["cibuildwheel"]
    assert cibw["build-frontend"] == "pip"
    repair = cibw["linux"]["repair-wheel-command"]
    assert repair.startswith("auditwheel repair") and "{wheel}" in repair and "{dest_dir}" in repair
    for lib in ("libcuda.so.*", "libnvrtc*.so.*", "libcublas.so.*", "libcublasLt.so.*"):
        assert f"--exclude '{lib}'" in repair, lib
    with open(os.path.join(ROOT, "scripts", "setup.sh")) as f:
        setup = f.read()
    assert "repair-wheel-command" in setup
    assert "--no-isolation" not in setup and "--no-build-isolation" not in setup


def test_sdist_holds_the_sources():
    sdist = _sdist()
    assert os.path.basename(sdist) == f"{DIST_FILE}-{_meson_version()}.tar.gz"
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        top = tar.getnames()[0].split("/")[0]
        pkg_info = tar.extractfile(f"{top}/PKG-INFO").read().decode()
    for needed in ["pyproject.toml", "meson.build", "README.md", "LICENSE", "CHANGELOG.md",
                   "src/find_cuda_headers.py", "src/tensorplay/_version.py.in", "scripts/setup.sh",
                   *(f"src/tensorplay/{m}.pyx" for m in COMPILED),
                   *(f"src/tensorplay/{m}.pyi" for m in COMPILED)]:
        assert needed in names, needed
    assert f"\nName: {DIST}\n" in pkg_info and f"\nVersion: {_meson_version()}\n" in pkg_info
    assert f"\nClassifier: {CUDA_CLASSIFIER}\n" in pkg_info


def test_show_config_names_the_versions(capsys):
    tensorplay.show_config()
    out = capsys.readouterr().out
    assert tensorplay.__version__ in out
    assert "cuda-bindings" in out and "nvrtc" in out


# -- src/find_cuda_headers.py: what meson.build runs to find cuda.h ---------

def _fake_dist(site, name, version, files):
    """A distribution ``name`` ``version`` installed in ``site`` with ``files``
    ({relative path: text})."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text("".join(f"{path},,\n" for path in files))
    for path, text in files.items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text(text)


def _headers(site, version="13.5.37", cuda_version=13050):
    _fake_dist(site, "nvidia-cuda-runtime", version,
               {"nvidia/cu13/include/cuda.h": f"#pragma once\n#define CUDA_VERSION {cuda_version}\n"})


def _bindings(site, version="13.5.0"):
    _fake_dist(site, "cuda-bindings", version, {"cuda/bindings/cydriver.pxd": "# cydriver\n",
                                                 "cuda/bindings/__init__.py": ""})


def _find(site, pyproject=None):
    """Run the finder where ``site`` is the only place packages are found
    (no site-packages: ``-S``), as meson.build runs it."""
    env = dict(os.environ, PYTHONPATH=str(site))
    return subprocess.run([sys.executable, "-S", FINDER, pyproject or os.path.join(ROOT, "pyproject.toml")],
                          capture_output=True, text=True, env=env, cwd="/", timeout=60)


def _error(out):
    assert out.returncode == 1 and out.stdout == "", out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


def test_the_build_uses_the_pinned_headers_of_the_build_environment(tmp_path):
    _headers(tmp_path)
    _bindings(tmp_path)
    out = _find(tmp_path)
    assert out.returncode == 0, out.stderr
    include, bindings_root = out.stdout.splitlines()
    assert include == str(tmp_path / "nvidia" / "cu13" / "include")
    assert bindings_root == str(tmp_path)


def test_the_build_fails_clearly_without_the_headers(tmp_path):
    _bindings(tmp_path)
    minor = _build_minor()
    msg = _error(_find(tmp_path))
    assert "nvidia-cuda-runtime is not installed" in msg
    assert f'pip install "nvidia-cuda-runtime=={minor}.*"' in msg


def test_the_build_fails_clearly_on_headers_of_another_minor(tmp_path):
    _headers(tmp_path, "13.0.96", 13000)
    _bindings(tmp_path)
    minor = _build_minor()
    msg = _error(_find(tmp_path))
    assert "is CUDA 13.0 (nvidia-cuda-runtime 13.0.96)" in msg and f"against CUDA {minor}" in msg
    assert f'pip install "nvidia-cuda-runtime=={minor}.*"' in msg


def test_the_build_fails_clearly_on_cuda_bindings_of_another_minor(tmp_path):
    _headers(tmp_path)
    _bindings(tmp_path, "13.4.1")
    minor = _build_minor()
    msg = _error(_find(tmp_path))
    assert "cuda-bindings 13.4.1" in msg and f'pip install "cuda-bindings=={minor}.*"' in msg


def test_the_build_fails_clearly_when_the_pins_disagree(tmp_path):
    _headers(tmp_path)
    _bindings(tmp_path)
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        text = f.read()
    bad = tmp_path / "pyproject.toml"
    bad.write_text(re.sub(r'"nvidia-cuda-runtime==[^"]*"', '"nvidia-cuda-runtime==13.4.*"', text))
    msg = _error(_find(tmp_path, str(bad)))
    assert "must pin the same minor" in msg
