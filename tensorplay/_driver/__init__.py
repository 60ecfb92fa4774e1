# SPDX-License-Identifier: Apache-2.0
"""The driver floor (compiled, lowest): contexts and errors (``context``),
streams and events (``stream``), raw copies (``memcpy``) and kernel launch
(``launch``). Nothing here imports any other part of tensorplay."""
