# SPDX-License-Identifier: Apache-2.0
"""The Sphinx documentation builds with warnings as errors (CPU: runs on CI),
its API reference has an entry for every public name, its offline
intersphinx inventories are what docs/make_inventories.py writes, and the
README and the docs point to nothing outside the repository."""

import importlib.util
import inspect
import os
import pathlib
import re
import shutil
import subprocess
import sys
import zlib

import pytest

from helpers import ROOT

DOCS = os.path.join(ROOT, "docs")


@pytest.fixture(scope="module")
def html(tmp_path_factory):
    """The HTML docs, built once: with -W when Graphviz is there, else without
    it (the debugging guide's DOT picture cannot render, the rest can)."""
    # looked up, not imported: Sphinx builds in a subprocess, and "sphinx"
    # in sys.modules changes how SciPy (under transformers) builds its docstrings
    for name in ("sphinx", "myst_parser"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed")
    out = tmp_path_factory.mktemp("docs") / "html"
    full = shutil.which("dot") is not None
    # the README's command, from the repository root: -P keeps the source
    # folder tensorplay/ off sys.path, so the installed package is documented
    cmd = [sys.executable, "-P", "-m", "sphinx"] + (["-W", "--keep-going"] if full else []) + \
        ["-b", "html", "-q", "docs", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900)
    return out, full, res


def test_docs_build_without_warnings(html):
    out, full, res = html
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    if not full:
        pytest.skip("Graphviz 'dot' is not installed (the debugging guide renders a DOT picture)")
    page = (out / "api.html").read_text()
    for name in ("stage_and_launch", "begin_capture_to_while_node", "cudagraphify", "memory_reserved"):
        assert name in page, f"{name} missing from the API reference"
    assert "<svg" in (out / "guide" / "debugging.html").read_text() or \
        list((out / "_images").glob("graphviz-*.svg")), "the DOT picture was not rendered"


def _inventory(path):
    """{name: (role, uri)} of a Sphinx objects.inv (version 2)."""
    with open(path, "rb") as f:
        header = [f.readline() for _ in range(4)]
        assert header[0].startswith(b"# Sphinx inventory version 2"), header[0]
        body = zlib.decompress(f.read()).decode()
    out = {}
    for line in body.splitlines():
        name, rest = line.split(" ", 1)
        role, _prio, uri, _disp = rest.split(" ", 3)
        out[name] = (role, uri)
    return out


def _public_names():
    import tensorplay as tp
    from tensorplay.cuda import CUDAGraph, cudagraphs
    names = set()
    for path, module in (("tensorplay", tp), ("tensorplay.cuda", tp.cuda), ("tensorplay.cuda.cudagraphs", cudagraphs),
                         ("tensorplay.types", tp.types), ("tensorplay.return_types", tp.return_types),
                         ("tensorplay.nn.functional", tp.nn.functional)):
        names.update(f"{path}.{n}" for n in module.__all__)
    # every public member of Tensor and CUDAGraph, inherited ones included
    names.update(f"tensorplay.Tensor.{n}" for n in dir(tp.Tensor) if not n.startswith("_"))
    names.update(f"tensorplay.cuda.CUDAGraph.{n}" for n in dir(CUDAGraph) if not n.startswith("_"))
    # the members the other public classes define
    for path, cls in (("tensorplay.cuda.Stream", tp.cuda.Stream), ("tensorplay.cuda.ExternalStream",
                                                                   tp.cuda.ExternalStream),
                      ("tensorplay.cuda.Event", tp.cuda.Event), ("tensorplay.cuda.RawKernel", tp.cuda.RawKernel),
                      ("tensorplay.cuda.ElementwiseKernel", tp.cuda.ElementwiseKernel),
                      ("tensorplay.dtype", tp.dtype), ("tensorplay.device", tp.device),
                      ("tensorplay.Generator", tp.Generator),
                      ("tensorplay.cuda.cudagraphs.CUDAGraphified", cudagraphs.CUDAGraphified)):
        names.update(f"{path}.{n}" for n, v in vars(cls).items()
                     if not n.startswith("_") and (callable(v) or inspect.isdatadescriptor(v)))
    return names


def test_every_public_name_has_an_entry_in_the_api_reference(html):
    """autodoc leaves out a name without a docstring, silently: the inventory
    of the built docs must hold every name in the __all__ lists and every
    public member of the public classes."""
    out, _full, res = html
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    inv = _inventory(out / "objects.inv")
    missing = sorted(_public_names() - set(inv))
    assert not missing, f"no entry in the API reference for {missing}"
    assert inv["tensorplay.mean"][1].startswith("api.html#"), inv["tensorplay.mean"]


def _signatures(page):
    """The text of every signature line (``<dt class="sig ...">``) of a page."""
    import html as html_mod
    import re
    out = []
    for body in re.findall(r'<dt class="sig[^"]*"[^>]*>(.*?)</dt>', page, re.S):
        text = html_mod.unescape(re.sub(r"<[^>]+>", "", body)).replace("\u00b6", "")
        out.append(re.sub(r"\s+", " ", text).strip())
    return out


def test_api_signatures_show_types_and_no_self(html):
    """Signatures come from the stubs: typed, without self; no Cython embedded
    signature or garbled first line is left in the text."""
    out, _full, res = html
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    page = (out / "api.html").read_text()
    sigs = _signatures(page)
    assert len(sigs) > 300, len(sigs)
    assert not [s for s in sigs if "(self" in s], "a signature shows self"
    untyped = [s for s in sigs if "(" in s and not s.startswith(("class ", "exception "))
               and "->" not in s and "\u2192" not in s]
    assert not untyped, f"signatures without a return type: {untyped[:10]}"
    assert "TensorBase." not in page, "a Cython embedded signature leaked into the text"
    assert "the largest value;" not in page
    for sig in ("mean(input: Tensor, dim: Dims = None, keepdim: bool = False, *, dtype: DTypeLike = None, "
                "out: Tensor | None = None) \u2192 Tensor",
                "replay(stream: StreamLike | None = None) \u2192 None",
                "numel() \u2192 int",
                "tensorplay.max(input: Tensor, dim: int, keepdim: bool = False) \u2192 max[Tensor]",
                "class tensorplay.cuda.Stream(device: DeviceLike = None, priority: int = 0)",
                "capture_begin(pool: PoolLike = None, capture_error_mode: CaptureErrorMode = 'global', "
                "stream: StreamLike | None = None, foreign: bool | None = None) \u2192 None"):
        assert any(s.endswith(sig) or s == sig for s in sigs), f"signature not in the reference: {sig}"


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


# A path the README or the docs name: from the repository root, or relative (../)
_REPO_PATH = re.compile(r"(?<![\w./-])((?:\.\./)+[\w./-]*|(?:tests|docs|scripts|benchmarks|examples|src|tensorplay)"
                        r"/[\w./-]*\.(?:pyx|pxd|pyi|py|md|rst|sh|hpp|txt|ini|toml|in)(?!\w))")


def test_readme_and_docs_name_only_files_of_the_repository():
    """A clone or an sdist has what the README and the docs point to: no
    path out of the repository, none into git-ignored folders, and every
    file named from the repository root exists."""
    root = pathlib.Path(ROOT)
    pages = [root / "README.md"] + sorted(p for p in (root / "docs").rglob("*")
                                           if p.suffix in (".md", ".rst") and "_build" not in p.parts)
    bad = []
    for page in pages:
        text = page.read_text()
        if ".device/" in text:
            bad.append(f"{page.relative_to(root)}: names .device/ (not in the repository)")
        for m in _REPO_PATH.finditer(text):
            name = m.group(1).rstrip(".")
            if name.startswith("../"):
                target = (page.parent / name).resolve()
                if root.resolve() not in (target, *target.parents):
                    bad.append(f"{page.relative_to(root)}: {name} is outside the repository")
            elif not (root / name).exists():
                bad.append(f"{page.relative_to(root)}: {name} does not exist")
    assert not bad, "\n".join(bad)


def test_the_readme_lists_every_example():
    """Each script of examples/ is named in the README's list of examples."""
    readme = (pathlib.Path(ROOT) / "README.md").read_text()
    listed = readme[readme.index("- `examples/`:"):]
    listed = listed[:listed.index("\n\n")]
    missing = [p.name for p in sorted((pathlib.Path(ROOT) / "examples").glob("*.py")) if f"`{p.name}`" not in listed]
    assert not missing, f"the README's list of examples leaves out {missing}"


def _section_code(page, heading):
    """The first ```python block after ``heading`` in docs/``page``."""
    text = (pathlib.Path(DOCS) / page).read_text()
    text = text[text.index(heading):]
    start = text.index("```python\n") + len("```python\n")
    return text[start:text.index("```", start)]


def test_the_getting_started_cpu_snippet_prints_what_it_says(tmp_path):
    """The "Without a GPU" snippet runs with CUDA switched off and prints
    what its comments say (the last line names why CUDA is unavailable,
    which depends on the machine: only its first word is checked)."""
    code = _section_code("getting-started.md", "## Without a GPU")
    expected = []
    for line in code.splitlines():
        if line.startswith("print(") and "#" in line:
            expected.append(line.split("#", 1)[1].strip())
        elif line.startswith(("# tensor(", "# False")):      # the output of the print above
            expected.append(line[2:].strip())
    env = dict(os.environ, TENSORPLAY_DISABLE_CUDA="1")
    res = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    got = [line.strip() for line in res.stdout.splitlines() if line.strip()]
    assert len(expected) >= 4, f"the snippet's expected outputs were not found: {expected}"
    assert got[:3] == expected[:3], f"printed {got[:3]}, the page says {expected[:3]}"
    assert got[3].split()[0] == expected[3].split()[0], f"printed {got[3]!r}, the page says {expected[3]!r}"
