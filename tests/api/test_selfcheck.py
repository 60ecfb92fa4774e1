# SPDX-License-Identifier: Apache-2.0
"""``python -m tensorplay``: the configuration, then (with a GPU) a short
self-check whose failures are named."""

import io

import pytest

import tensorplay as tp
from helpers import HAS_CUDA, run_python
from tensorplay import _selfcheck


def test_python_m_tensorplay_prints_the_config_and_the_self_check():
    res = run_python("import runpy; runpy.run_module('tensorplay', run_name='__main__')")
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"tensorplay: {tp.__version__}" in res.stdout
    if HAS_CUDA:
        assert "All checks passed." in res.stdout
    else:
        assert "Self-check skipped: no usable CUDA GPU" in res.stdout


def test_a_failing_check_is_named_and_the_others_still_run(monkeypatch):
    def broken():
        raise ValueError("the replay gave 3, NumPy 4")

    monkeypatch.setattr(_selfcheck, "CHECKS", (("broken check", broken), ("fine check", lambda: "all good")))
    monkeypatch.setattr(_selfcheck.tp.cuda, "is_available", lambda: True)
    monkeypatch.setattr(_selfcheck.tp.cuda, "get_device_name", lambda device=None: "a test GPU")
    out = io.StringIO()
    assert _selfcheck.self_check(out) is False
    lines = out.getvalue().splitlines()
    assert "  FAILED  broken check: ValueError: the replay gave 3, NumPy 4" in lines
    assert any(line.startswith("  ok      fine check: all good (") for line in lines)
    assert lines[-1] == "Some checks failed: see above."


@pytest.mark.cuda
def test_every_self_check_passes_on_the_gpu():
    out = io.StringIO()
    assert _selfcheck.self_check(out), out.getvalue()
    assert out.getvalue().count("  ok  ") == len(_selfcheck.CHECKS)
