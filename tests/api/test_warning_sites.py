# SPDX-License-Identifier: Apache-2.0
"""Warnings tensorplay raises name the user's line: ``warn_user`` attributes
a warning to the nearest frame outside the package however deep the call
came from, ``call_site`` names that frame, and the test suite's filter
(pyproject.toml) fails any warning attributed to a tensorplay module.
No GPU needed: the nested calls are functions whose module is named as
tensorplay's modules are (the graph layer's own paths are checked in
tests/graph/test_graphs.py on a GPU)."""

import sys
import warnings

import pytest

from tensorplay._testing import call_site, warn_user


def _module(name, source, **names):
    """The functions ``source`` defines, run as if in module ``name``."""
    ns = {"__name__": name, **names}
    exec(compile(source, f"<{name}>", "exec"), ns)
    return ns


# a user's callback called by tensorplay, calling tensorplay, which warns
INNER = _module("tensorplay._fake.inner", "def inner(cat):\n    warn_user('deep', cat)\n",
                warn_user=warn_user)
MIDDLE = _module("tensorplay._fake.middle", "def middle(cat):\n    return inner(cat)\n", inner=INNER["inner"])
OUTER = _module("tensorplay", "def outer(fn, *args):\n    return fn(*args)\n")


def test_warn_user_points_at_the_first_frame_outside_the_package():
    with pytest.warns(RuntimeWarning, match="deep") as caught:
        OUTER["outer"](MIDDLE["middle"], RuntimeWarning); line = sys._getframe().f_lineno   # noqa: E702
    [w] = caught
    assert (w.filename, w.lineno) == (__file__, line)
    assert w.category is RuntimeWarning


def test_a_users_callback_between_tensorplay_frames_is_the_place():
    def callback():
        MIDDLE["middle"](UserWarning); return sys._getframe().f_lineno    # noqa: E702
    with pytest.warns(UserWarning, match="deep") as caught:
        line = OUTER["outer"](callback)
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)


def test_the_warning_is_attributed_to_the_users_module():
    """So a filter on the caller's module applies, and not one on tensorplay's."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", module="tensorplay")       # would hide one pointing inside
        MIDDLE["middle"](UserWarning)
    assert [str(w.message) for w in caught] == ["deep"] and caught[0].filename == __file__


def test_call_site_names_the_callers_line():
    site = _module("tensorplay._fake.site", "def site():\n    return call_site()\n", call_site=call_site)
    got = OUTER["outer"](site["site"]); line = sys._getframe().f_lineno     # noqa: E702
    assert got == f"{__file__}:{line} (test_call_site_names_the_callers_line)"


def test_a_warning_attributed_to_tensorplay_fails_the_tests():
    """pyproject.toml's filter ('error::Warning:tensorplay', a regex matched
    from the start of the module's name): a plain warnings.warn inside a
    tensorplay module becomes an error here, any category; the same from a
    module outside the package does not."""
    inside = _module("tensorplay._fake.raw", "def raw(cat):\n    warnings.warn('raw', cat)\n", warnings=warnings)
    for cat in (UserWarning, RuntimeWarning, DeprecationWarning, ResourceWarning):
        with pytest.raises(cat, match="raw"):
            inside["raw"](cat)
    outside = _module("not_tensorplay.raw", "def raw(cat):\n    warnings.warn('raw', cat)\n", warnings=warnings)
    with warnings.catch_warnings(record=True) as caught:       # the suite's filters, unchanged
        outside["raw"](UserWarning)
    assert [str(w.message) for w in caught] == ["raw"]
