# SPDX-License-Identifier: Apache-2.0
"""The caller's place: the nearest frame outside tensorplay.

A warning tensorplay raises for the user, and the place an error names
(where a capture began), point at the user's code, however deep in the
package the call came from: ``graph()``'s ``__exit__``, ``cudagraphify``,
``make_graphed_callables`` and ``GraphSet`` all reach ``capture_end``
through frames of their own, so no fixed ``stacklevel`` is right for every
path. Frames are told apart by their module's ``__name__`` (a compiled
module makes no frame, so its callers' frames are what is seen).
"""

from __future__ import annotations

import sys
import warnings
from types import FrameType

PACKAGE = "tensorplay"


def in_package(frame: FrameType) -> bool:
    """Whether ``frame`` runs code of a tensorplay module."""
    return str(frame.f_globals.get("__name__", "")).partition(".")[0] == PACKAGE


def user_frame_depth() -> tuple[FrameType | None, int]:
    """The nearest frame outside tensorplay, from the caller of this
    function up, and its depth counted from that caller (0 is the caller
    itself). Where every frame is tensorplay's (``python -m tensorplay``
    run from a script of the package), the outermost frame and its depth."""
    frame: FrameType | None = sys._getframe(1)
    depth = 0
    last, last_depth = frame, 0
    while frame is not None and in_package(frame):
        last, last_depth = frame, depth
        frame = frame.f_back
        depth += 1
    if frame is None:
        return last, last_depth
    return frame, depth


def call_site() -> str:
    """``file:line (function)`` of the nearest caller outside tensorplay."""
    frame, _ = user_frame_depth()
    if frame is None:
        return "an unknown place"
    return f"{frame.f_code.co_filename}:{frame.f_lineno} ({frame.f_code.co_name})"


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the nearest frame
    outside tensorplay: the user's line that led here, its file and module
    (so a filter on the user's module applies, and ``-W error`` on
    tensorplay's modules catches a warning that would point inside them)."""
    _, depth = user_frame_depth()      # depth 0: this function's frame, as is stacklevel 1
    warnings.warn(message, category, stacklevel=depth + 1)
