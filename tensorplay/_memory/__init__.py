# SPDX-License-Identifier: Apache-2.0
"""Device memory: the caching allocator and its pools (``allocator``,
compiled) and the readable summary of its statistics (``summary``)."""
