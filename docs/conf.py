# SPDX-License-Identifier: Apache-2.0
"""Sphinx configuration. Built on CI with warnings as errors:

    sphinx-build -W --keep-going -b html docs docs/_build/html

It documents the installed tensorplay (build it first: scripts/setup.sh).
"""

import os
import sys

import tensorplay

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

project = "tensorplay"
author = "The tensorplay developers"
copyright = "2026, The tensorplay developers"
release = version = tensorplay.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinx.ext.graphviz",
    "myst_parser",
    "stub_signatures",   # docs/stub_signatures.py: signatures and types from the stubs
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "_inventories"]
myst_heading_anchors = 3
napoleon_numpy_docstring = True
napoleon_google_docstring = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# the types of the signatures are written fully qualified (so that they link)
# and shown by their last component
python_use_unqualified_type_names = True
# a documented function or method that no stub declares is an error (-W)
stub_signatures_strict = True
graphviz_output_format = "svg"
html_theme = "alabaster"
html_static_path: list[str] = []

# Offline inventories (docs/_inventories, written by make_inventories.py) point
# at the projects' real documentation: the build needs no network.
intersphinx_mapping = {
    "numpy": ("https://numpy.org/doc/stable/", os.path.join(HERE, "_inventories", "numpy.inv")),
    "torch": ("https://docs.pytorch.org/docs/stable/", os.path.join(HERE, "_inventories", "torch.inv")),
    "cuda-bindings": ("https://nvidia.github.io/cuda-python/cuda-bindings/latest/",
                      os.path.join(HERE, "_inventories", "cuda-bindings.inv")),
}


def _render_example_graph():
    """The picture in guide/debugging: the DOT tensorplay writes for a WHILE
    node holding an IF node, from a fixed description (no GPU needed)."""
    from tensorplay.cuda import to_dot
    from example_graph import DESCRIPTION
    out = os.path.join(HERE, "_generated")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "while_if.dot"), "w") as f:
        f.write(to_dot(DESCRIPTION, title="while_if"))


_render_example_graph()
