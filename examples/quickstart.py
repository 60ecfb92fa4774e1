# SPDX-License-Identifier: Apache-2.0
"""Quick start: tensors on the GPU, streams and zero-copy interop.

Run from anywhere but the repository root:  python examples/quickstart.py
"""

import sys

import numpy as np

import tensorplay as tp


def main():
    if not tp.cuda.is_available():
        print(f"No CUDA GPU here ({tp.cuda.unavailable_reason()}).")
        print("tensorplay's CPU tensors still work:", tp.arange(5).tolist())
        return 0
    print("GPU:", tp.cuda.get_device_name(0), "capability", tp.cuda.get_device_capability(0))
    x = tp.tensor(np.linspace(0, 1, 8, dtype=np.float32), device="cuda")
    h = tp.empty(8, dtype=tp.float16, device="cuda")
    s = tp.cuda.Stream()
    with tp.cuda.stream(s):
        h.copy_(x)                      # cast on the GPU, queued on s
    s.synchronize()
    print("float16 copy:", h.tolist())
    print("allocated:", tp.cuda.memory_allocated(), "bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
