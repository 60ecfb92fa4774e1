# SPDX-License-Identifier: Apache-2.0
"""Every public exception shows its public path (``tensorplay.cuda.X``, as
PyTorch shows ``torch.OutOfMemoryError``), never the private module that
defines it: in ``repr`` of the class, in a traceback, in pickles; and the
path leads back to the class. NVRTC's errors name their result once."""

import importlib
import pickle
import subprocess
import sys
import traceback

import pytest

import tensorplay as tp
from helpers import KERNEL_ARCH, run_python
from tensorplay._kernels import nvrtc

# One instance of each public exception (the constructors differ)
INSTANCES = {
    "CudaError": lambda: tp.cuda.CudaError(1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"),
    "OutOfMemoryError": lambda: tp.cuda.OutOfMemoryError(),
    "CudaUnavailableError": lambda: tp.cuda.CudaUnavailableError("CUDA is not available: no GPU"),
    "HostFunctionError": lambda: tp.cuda.HostFunctionError("a host function raised"),
    "CublasError": lambda: tp.cuda.CublasError(15, "cublasLtMatmul"),
    "CublasUnavailableError": lambda: tp.cuda.CublasUnavailableError("no cuBLASLt"),
    "CollectiveError": lambda: tp.cuda.CollectiveError("run one collective eagerly before capturing"),
    "ForeignRandomError": lambda: tp.cuda.ForeignRandomError("torch.rand inside a capture"),
    "CompileInCaptureError": lambda: tp.cuda.CompileInCaptureError("torch.compile began compiling in a capture"),
    "PoolAsleepError": lambda: tp.cuda.PoolAsleepError("the pool sleeps"),
    "NVRTCError": lambda: tp.cuda.NVRTCError("compiling k.cu for sm_90 failed: NVRTC_ERROR_COMPILATION", "log"),
}


def _exported_exceptions():
    """{public path: class} of every exception class the public modules export."""
    out = {}
    for module in (tp, tp.cuda, tp.backends, tp.nn, tp.nn.functional, tp.types, tp.return_types):
        for name in dir(module):
            value = getattr(module, name)
            if isinstance(value, type) and issubclass(value, BaseException) and not name.startswith("_") \
                    and value.__module__.startswith("tensorplay"):
                out[f"{module.__name__}.{name}"] = value
    return out


def test_every_public_exception_is_listed_here():
    exported = _exported_exceptions()
    assert {cls.__name__ for cls in exported.values()} == set(INSTANCES), exported
    # NVRTCError beside the others in tensorplay.cuda, and the same class at the top
    assert tp.cuda.NVRTCError is tp.NVRTCError is nvrtc.NVRTCError
    assert "NVRTCError" in tp.cuda.__all__ and "NVRTCError" in tp.__all__


@pytest.mark.parametrize("name", sorted(INSTANCES))
def test_a_public_exception_shows_its_public_path(name):
    err = INSTANCES[name]()
    cls = type(err)
    public = f"{cls.__module__}.{cls.__qualname__}"
    assert public == f"tensorplay.cuda.{name}"
    assert getattr(importlib.import_module(cls.__module__), cls.__qualname__) is cls     # the path resolves
    assert repr(cls) == str(cls) == f"<class '{public}'>"
    assert traceback.format_exception_only(cls, err)[-1].startswith(f"{public}: ")
    try:
        raise err
    except tp.cuda.CudaError if name == "OutOfMemoryError" else cls:
        text = traceback.format_exc()
    assert text.splitlines()[-1 - str(err).count("\n")].startswith(f"{public}: ")
    assert "tensorplay._" not in "".join(traceback.format_exception_only(cls, err))
    data = pickle.dumps(err)
    assert b"tensorplay.cuda" in data and b"tensorplay._" not in data
    back = pickle.loads(data)
    assert type(back) is cls and str(back) == str(err)


def test_an_uncaught_error_prints_its_public_path():
    """The last line of the traceback Python prints for an uncaught error."""
    out = run_python("import tensorplay as tp\nraise tp.cuda.PoolAsleepError('wake() it first')",
                     TENSORPLAY_DISABLE_CUDA="1")
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == "tensorplay.cuda.PoolAsleepError: wake() it first"


def test_nvrtc_errors_name_their_result_once(kernel_cache):
    with pytest.raises(tp.cuda.NVRTCError) as info:
        nvrtc.compile_cubin('extern "C" __global__ void k() { nope = 1; }', "bad_once.cu", (), KERNEL_ARCH)
    first = str(info.value).splitlines()[0]
    assert first == f"compiling bad_once.cu for sm_{KERNEL_ARCH} failed: NVRTC_ERROR_COMPILATION", first
    assert str(info.value).count("NVRTC_ERROR_COMPILATION") == 1
    assert "nope" in info.value.log
    line = traceback.format_exception_only(type(info.value), info.value)[0]
    assert line.startswith("tensorplay.cuda.NVRTCError: compiling bad_once.cu")
    back = pickle.loads(pickle.dumps(info.value))
    assert str(back) == str(info.value) and back.log == info.value.log


def test_no_exception_class_is_left_with_a_private_module():
    """A class of the package that subclasses Exception and is exported
    anywhere public has its public __module__ (checked in a fresh process,
    every module imported)."""
    code = ("import pkgutil, importlib, tensorplay\n"
            "bad = []\n"
            "for m in pkgutil.walk_packages(tensorplay.__path__, 'tensorplay.'):\n"
            "    if m.name.endswith('__main__'): continue\n"
            "    mod = importlib.import_module(m.name)\n"
            "    for k, v in vars(mod).items():\n"
            "        if isinstance(v, type) and issubclass(v, Exception) and not k.startswith('_') \\\n"
            "                and v.__module__.startswith('tensorplay._') and v.__name__ == k:\n"
            "            bad.append(f'{v.__module__}.{k}')\n"
            "print(sorted(set(bad)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]", out.stdout
