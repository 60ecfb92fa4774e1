# SPDX-License-Identifier: Apache-2.0
"""Write the offline intersphinx inventories in docs/_inventories: the few
targets these docs link to in NumPy's, PyTorch's and cuda-bindings' own
documentation, with their real addresses there. Run after adding a link:

    python docs/make_inventories.py
"""

import os
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))

TARGETS = {
    "numpy": ("NumPy", [
        ("numpy.ndarray", "py:class", "reference/generated/numpy.ndarray.html#numpy.ndarray"),
        ("numpy.dtype", "py:class", "reference/generated/numpy.dtype.html#numpy.dtype"),
    ]),
    "torch": ("PyTorch", [
        ("torch.Tensor", "py:class", "tensors.html#torch.Tensor"),
        ("torch.cuda.CUDAGraph", "py:class", "generated/torch.cuda.CUDAGraph.html#torch.cuda.CUDAGraph"),
        ("torch.cuda.graph", "py:class", "generated/torch.cuda.graph.html#torch.cuda.graph"),
        ("torch.cuda.make_graphed_callables", "py:function",
         "generated/torch.cuda.make_graphed_callables.html#torch.cuda.make_graphed_callables"),
    ]),
    "cuda-bindings": ("cuda-bindings", [
        ("cuda.bindings.driver", "py:module", "module/driver.html#module-cuda.bindings.driver"),
    ]),
}


def write(name, project, entries):
    head = (f"# Sphinx inventory version 2\n# Project: {project}\n# Version: \n"
            "# The remainder of this file is compressed using zlib.\n").encode()
    body = "".join(f"{obj} {role} 1 {uri} -\n" for obj, role, uri in entries).encode()
    path = os.path.join(HERE, "_inventories", f"{name}.inv")
    with open(path, "wb") as f:
        f.write(head + zlib.compress(body))
    return path


if __name__ == "__main__":
    for name, (project, entries) in TARGETS.items():
        print("wrote", write(name, project, entries))
