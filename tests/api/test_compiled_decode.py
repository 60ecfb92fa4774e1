# SPDX-License-Identifier: Apache-2.0
"""benchmarks/compiled_decode.py without a GPU: it says why in one line and
exits 0 (and without PyTorch on a GPU machine too); bad arguments are usage
errors before any GPU check."""

import subprocess
import sys

import pytest

from helpers import HAS_CUDA, ROOT

BENCH = ROOT / "benchmarks"
SCRIPT = BENCH / "compiled_decode.py"


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd="/",
                          timeout=120)


@pytest.fixture
def script(monkeypatch):
    """The script as a module (benchmarks/ on the path for tpbench)."""
    monkeypatch.syspath_prepend(str(BENCH))
    import compiled_decode
    return compiled_decode


@pytest.mark.skipif(HAS_CUDA, reason="a GPU is here: the script measures instead")
def test_without_a_gpu_it_says_why_in_one_line_and_exits_0():
    res = _run("--tokens", "8", "--rounds", "1")
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("no GPU: "), res.stdout
    assert res.stderr == ""


def test_without_pytorch_it_says_why_in_one_line_and_exits_0(script, monkeypatch, capsys):
    monkeypatch.setattr(script.tp.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "torch", None)          # import torch raises ImportError
    assert script.main(["--tokens", "8"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["PyTorch is needed: the decode step is PyTorch code, compiled with torch.compile"]


@pytest.mark.parametrize("args, words", [
    (("--tokens", "300"), "does not fit the KV cache (--max-len 256)"),
    (("--tokens", "0"), "must be positive"),
    (("--check-every", "-1"), "not negative"),
    (("--model", "big"), "invalid choice: 'big'"),
    (("--mode", "reduce-overhead"), "invalid choice: 'reduce-overhead'"),
])
def test_bad_arguments_are_usage_errors(script, capsys, args, words):
    with pytest.raises(SystemExit) as info:
        script.main(list(args))
    assert info.value.code == 2
    assert words in capsys.readouterr().err
