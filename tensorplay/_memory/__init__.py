# SPDX-License-Identifier: Apache-2.0
"""Device memory, lowest first: where segments and events come from
(``backend``; ``testing``: the fake backend, for tests without a GPU), pools
of blocks and the capture allocating into a pool (``pool``), the caching
allocator's policy and statistics (``allocator``), the public memory
functions (``api``), all compiled; and in Python byte counts for people
(``units``) and the readable summary of the statistics (``summary``)."""
