# SPDX-License-Identifier: Apache-2.0
"""Per-device default generators: ``tensorplay.cuda.random`` (defined in ``tensorplay._random.cuda``)."""

from tensorplay._random.cuda import (default_generators, get_rng_state, initial_seed, manual_seed, manual_seed_all,
                                     set_rng_state)

__all__ = ["default_generators", "get_rng_state", "initial_seed", "manual_seed", "manual_seed_all",
           "set_rng_state"]
