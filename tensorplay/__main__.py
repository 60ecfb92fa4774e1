# SPDX-License-Identifier: Apache-2.0
"""``python -m tensorplay``: show the configuration and, with a GPU, run a short self-check."""

import sys

from tensorplay._selfcheck import main

if __name__ == "__main__":        # importing the module (stubtest, docs) runs nothing
    sys.exit(main())
