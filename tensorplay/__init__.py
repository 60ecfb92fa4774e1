# SPDX-License-Identifier: Apache-2.0
"""tensorplay: CUDA graphs made practical from Python, with a small tensor library."""

from __future__ import annotations

import importlib.util as _importlib_util
import os as _os
import sys as _sys


def _installed_elsewhere():
    """The spec of the first tensorplay with compiled modules on ``sys.path``
    outside the folder that holds this one, or None."""
    import importlib.machinery as _machinery
    here = _os.path.realpath(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))
    for entry in _sys.path:
        if _os.path.realpath(entry or _os.getcwd()) == here:
            continue
        spec = _machinery.PathFinder.find_spec(__name__, [entry])
        if spec is None or spec.loader is None or not spec.submodule_search_locations:
            continue
        for folder in spec.submodule_search_locations:
            if any(_os.path.isfile(_os.path.join(folder, "_driver", "context" + suffix))
                   for suffix in _machinery.EXTENSION_SUFFIXES):
                return spec
    return None


# A clone's source folder tensorplay/ holds only the pure-Python half, and
# Python finds it first when it runs in the clone's root (`python -c`,
# `python -m`, the REPL) or a script there. Where an installed tensorplay
# comes later on sys.path, that one is loaded in this module's place: the
# import statement and runpy (`python -m tensorplay`) take the module that
# sys.modules holds once this one has run, and the submodules come from the
# installed package's folder. Without one, say what is wrong instead of
# failing below with a bare ModuleNotFoundError.
if _importlib_util.find_spec("tensorplay._driver.context") is None:
    _installed = _installed_elsewhere()
    if _installed is None or _installed.loader is None:
        raise ImportError(
            f"tensorplay's compiled modules are not here: {_os.path.dirname(__file__)} looks like the source "
            f"folder of a clone, found first on sys.path because Python runs in the clone's root (or a script "
            f"there), and no installed tensorplay comes after it: this Python ({_sys.executable}) has none. "
            f"Install it (`pip install .` in the clone), or use the Python that has it (after "
            f"`bash scripts/setup.sh`: `.venv/bin/python`). See docs/troubleshooting.md.")
    for _name in [n for n in _sys.modules if n.startswith(__name__ + ".")]:
        del _sys.modules[_name]        # tensorplay._driver, imported from here by find_spec
    _module = _importlib_util.module_from_spec(_installed)
    _sys.modules[__name__] = _module
    try:
        _installed.loader.exec_module(_module)
    except BaseException:
        _sys.modules.pop(__name__, None)
        raise
else:
    from tensorplay import cuda
    from tensorplay._device import device
    from tensorplay._dtypes import (ALL_DTYPES, bfloat16, bool_, dtype, float16, float32, float64, int8, int16,
                          int32, int64, uint8)
    from tensorplay._tensor.interop import as_tensor, from_dlpack
    from tensorplay._config import config, show_config
    from tensorplay._kernels.nvrtc import NVRTCError
    from tensorplay._version import __version__  # written by meson from meson.build
    from tensorplay._tensor.creation import (arange, empty, empty_like, from_numpy, full, full_like, is_tensor, ones,
                                             ones_like, tensor, zeros, zeros_like)
    from tensorplay._tensor.tensor import Tensor
    from tensorplay._tensor import transfer as _transfer
    from tensorplay._driver import context as _context
    from tensorplay._driver import teardown as _teardown
    from tensorplay._graph import registry as _registry
    from tensorplay._graph import foreign as _foreign

    from tensorplay._ops import methods as _methods_mod
    from tensorplay._ops.distributions import (bernoulli, dropout, rand, rand_like, randint, randint_like, randn,
                                               randn_like)
    from tensorplay._random.generator import (Generator, default_generator, get_rng_state, initial_seed, manual_seed,
                                              seed, set_rng_state)
    from tensorplay import nn
    from tensorplay import return_types
    from tensorplay import types
    from tensorplay._ops.promotion import can_cast, promote_types, result_type
    from tensorplay._ops.blas import get_float32_matmul_precision, set_float32_matmul_precision
    from tensorplay import backends
    from tensorplay._ops import indexing as _indexing
    from tensorplay._ops.custom import ElementwiseKernel, RawKernel  # noqa: F401  (also in tensorplay.cuda)

    # What lower floors receive from above, given here, once everything is imported
    # (docs/design.md): the Tensor methods made from the op tables, the check of
    # device-side index errors run at every host read, the converter of foreign
    # arrays (CUDA Array Interface, DLPack) that copy_ accepts, the sentence on
    # the open graph captures that the driver's errors carry, and the question
    # teardown asks before destroying driver objects (is PyTorch or CuPy
    # capturing on this thread?).
    _methods_mod.install(Tensor)
    globals().update(_methods_mod.FUNCTIONS)
    _transfer.register_device_error_check(_indexing.check_device_errors)
    _transfer.register_foreign_converter(as_tensor)
    _context.set_open_capture_describer(_registry.describe_open_captures)
    _teardown.set_foreign_capture_probe(_foreign.foreign_capture_on_this_thread)

    # PyTorch's dtype aliases. tensorplay.bool, .int and .float are attributes, as
    # torch.bool, but not in __all__: ``from tensorplay import *`` must leave the
    # builtins bool, int and float alone (tensorplay.bool_ is exported instead).
    bool = bool_   # noqa: A001 - tensorplay.bool, as torch.bool
    half = float16
    float = float32  # noqa: A001
    double = float64
    long = int64
    int = int32  # noqa: A001
    short = int16

    __all__ = sorted(_methods_mod.FUNCTIONS) + ["can_cast", "config", "promote_types", "result_type",
                                                 "show_config", "get_float32_matmul_precision",
                                                 "set_float32_matmul_precision"] + [
        "ALL_DTYPES", "NVRTCError", "Tensor", "arange", "as_tensor", "backends", "bfloat16", "bool_", "cuda",
        "device", "double", "dtype", "empty", "empty_like", "float16", "float32", "float64",
        "from_dlpack", "from_numpy", "full", "full_like", "half", "int8", "int16", "int32",
        "int64", "is_tensor", "long", "ones", "ones_like", "short", "tensor", "uint8", "zeros",
        "zeros_like",
        "Generator", "bernoulli", "default_generator", "dropout", "get_rng_state", "initial_seed", "manual_seed",
        "nn", "rand", "rand_like", "randint", "randint_like", "randn", "randn_like", "seed", "set_rng_state",
    ]
