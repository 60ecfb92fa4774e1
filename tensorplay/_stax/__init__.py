# SPDX-License-Identifier: Apache-2.0
"""Higher-level helpers built on tensorplay.cuda.graphs."""
