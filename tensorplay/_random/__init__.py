# SPDX-License-Identifier: Apache-2.0
"""Random numbers: the Philox4x32-10 stream and its exact transforms in NumPy
(``philox``, the CPU path and the reference the generated CUDA code matches
bit for bit) and the generators (``generator``). This package's
``__init__`` imports nothing, so the kernel generator can read ``philox``'s
constants without importing the generators above it."""
