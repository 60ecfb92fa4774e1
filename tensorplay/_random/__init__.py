# SPDX-License-Identifier: Apache-2.0
"""Random numbers: the generators and seeding functions (``generator``) and
the CUDA devices' default generators (``cuda``). The Philox stream they draw
from, its exact transforms in NumPy (the CPU path) and the CUDA kernels that
match it bit for bit live in the kernels floor (``tensorplay._kernels.philox``
and ``random_kernels``)."""
