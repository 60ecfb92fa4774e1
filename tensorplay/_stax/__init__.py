# SPDX-License-Identifier: Apache-2.0
"""The seed's name for the cudagraphify module: ``tensorplay._stax.cudagraphs``
is the module ``tensorplay.cuda.cudagraphs`` (one object, defined in
``tensorplay._graph.cudagraphs``)."""

import sys

from tensorplay._graph import cudagraphs

sys.modules[__name__ + ".cudagraphs"] = cudagraphs

__all__ = ["cudagraphs"]
