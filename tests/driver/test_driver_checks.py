# SPDX-License-Identifier: Apache-2.0
"""The driver's requirements, checked at initialisation: the unavailable
reason in one sentence (no driver, an old driver, old GPUs, the disable
variable), what CUDA calls do without a GPU, and the requirements holding on
the GPU machine."""

import subprocess
import sys

import pytest

import tensorplay as tp
from helpers import HAS_CUDA, run_python
from tensorplay._driver import context as _cuda


# ------------------------------------------------------------ requirements

def test_unavailable_reason_is_our_sentence():
    reason = tp.cuda.unavailable_reason()
    if HAS_CUDA:
        assert reason is None
        return
    assert isinstance(reason, str) and reason
    for internal in ("system search", "pathfinder", '"cuda"', "Traceback"):
        assert internal not in reason, reason
    assert "\n" not in reason and not reason.endswith(".")


def test_missing_driver_library_reads_as_our_sentence():
    from cuda.pathfinder import DynamicLibNotFoundError
    exc = DynamicLibNotFoundError('"cuda" is an NVIDIA driver library and can only be found via '
                                  'system search. Ensure the NVIDIA display driver is installed.')
    assert _cuda._driver_load_problem(exc) == "no NVIDIA driver was found (libcuda.so.1 could not be loaded)"
    other = _cuda._driver_load_problem(OSError("bad ELF"))
    assert other.startswith("the NVIDIA driver library libcuda.so.1 could not be used") and "bad ELF" in other


@pytest.mark.parametrize("version", [13000, 13010, 13050, 14000])
def test_cuda_13_drivers_are_accepted(version):
    assert _cuda._driver_version_problem(version) is None


@pytest.mark.parametrize("version,shown", [(12090, "12.9"), (12040, "12.4"), (11080, "11.8")])
def test_older_drivers_are_refused_in_one_sentence(version, shown):
    msg = _cuda._driver_version_problem(version)
    assert msg == (f"the NVIDIA driver supports CUDA {shown}, but tensorplay needs a driver for "
                   "CUDA 13.0 or newer (driver R580 or newer)")


def test_a_driver_without_a_version_is_refused():
    assert "cuDriverGetVersion" in _cuda._driver_version_problem(0)


@pytest.mark.parametrize("cc,ok", [((7, 5), True), ((8, 0), True), ((9, 0), True), ((10, 0), True),
                                   ((12, 1), True), ((7, 0), False), ((7, 2), False), ((6, 1), False)])
def test_compute_capability_floor_is_7_5(cc, ok):
    assert _cuda._capability_supported(*cc) is ok
    assert _cuda.MIN_COMPUTE_CAPABILITY == (7, 5)


def test_one_old_gpu_makes_cuda_unavailable_with_one_sentence():
    msg = _cuda._devices_problem([("Tesla V100-SXM2-16GB", 7, 0)])
    assert msg == ("cuda:0 (Tesla V100-SXM2-16GB) has compute capability 7.0, but tensorplay's "
                   "NVRTC-compiled kernels need compute capability 7.5 or newer (Turing or newer)")


def test_only_old_gpus_make_cuda_unavailable():
    msg = _cuda._devices_problem([("Tesla V100", 7, 0), ("Tesla P100", 6, 0)])
    assert msg.startswith("no CUDA device has compute capability 7.5 or newer")
    assert "cuda:0 Tesla V100 7.0" in msg and "cuda:1 Tesla P100 6.0" in msg


def test_one_supported_gpu_is_enough():
    assert _cuda._devices_problem([("Tesla V100", 7, 0), ("NVIDIA H200", 9, 0)]) is None
    assert _cuda._devices_problem([("NVIDIA H200", 9, 0)]) is None
    assert _cuda._devices_problem([]) == "the NVIDIA driver reports no CUDA devices"


def test_work_on_an_unsupported_device_names_it():
    msg = _cuda._unsupported_device_message(1, "Tesla V100", 7, 0)
    assert msg.startswith("cuda:1 (Tesla V100) has compute capability 7.0") and "7.5 or newer" in msg


@pytest.mark.parametrize("value,off", [(None, False), ("", False), ("0", False), ("false", False),
                                       ("no", False), ("OFF", False), ("1", True), ("yes", True),
                                       ("true", True)])
def test_disable_variable_values(value, off):
    assert _cuda.disabled_by_env(value) is off


def test_disable_variable_set_to_zero_leaves_cuda_alone():
    out = run_python("import tensorplay as tp\nprint(tp.cuda.unavailable_reason())", TENSORPLAY_DISABLE_CUDA="0")
    assert out.returncode == 0, out.stderr
    assert "TENSORPLAY_DISABLE_CUDA" not in out.stdout


def test_disabled_cuda_raises_a_public_error_type():
    out = run_python("import tensorplay as tp\ntp.zeros(2, device='cuda')", TENSORPLAY_DISABLE_CUDA="1")
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last == ("tensorplay.cuda.CudaUnavailableError: CUDA is not available: "
                    "the environment variable TENSORPLAY_DISABLE_CUDA turns CUDA off")


# ------------------------------------------------------------ without a GPU, and with one

def test_import_without_gpu_reports_unavailable():
    code = ("import os; os.environ['TENSORPLAY_DISABLE_CUDA']='1'\n"
            "import tensorplay as tp\n"
            "assert tp.cuda.is_available() is False\n"
            "assert tp.cuda.device_count() == 0\n"
            "assert 'TENSORPLAY_DISABLE_CUDA' in tp.cuda.unavailable_reason()\n"
            "try:\n    tp.empty(2, device='cuda')\nexcept tp.cuda.CudaUnavailableError as e:\n"
            "    print('OK', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("OK CUDA is not available")


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-GPU behaviour")
def test_cuda_calls_raise_clearly_without_gpu():
    assert not tp.cuda.is_available()
    for call in (lambda: tp.cuda.current_device(), lambda: tp.cuda.Stream(),
                 lambda: tp.zeros(3, device="cuda"), lambda: tp.cuda.synchronize(),
                 lambda: tp.cuda.mem_get_info(), lambda: tp.cuda.enable_peer_access(0, 1)):
        with pytest.raises(tp.cuda.CudaUnavailableError, match="CUDA is not available"):
            call()


@pytest.mark.cuda
def test_requirements_hold_on_the_gpu_machine():
    assert tp.cuda.driver_version() >= (13, 0)
    assert tp.cuda.unavailable_reason() is None
    for i in range(tp.cuda.device_count()):
        assert tp.cuda.is_device_supported(i) == (tp.cuda.get_device_capability(i) >= (7, 5))
