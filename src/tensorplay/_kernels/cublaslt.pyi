# SPDX-License-Identifier: Apache-2.0
from typing import final

from tensorplay._memory.allocator import DeviceAllocation

R_32F: int
R_64F: int
R_16F: int
R_16BF: int
COMPUTE_32F: int
COMPUTE_32F_FAST_TF32: int
COMPUTE_64F: int
OP_N: int
OP_T: int
EPILOGUE_DEFAULT: int
EPILOGUE_RELU: int
EPILOGUE_BIAS: int
EPILOGUE_RELU_BIAS: int
EPILOGUE_GELU: int
EPILOGUE_GELU_BIAS: int

class CublasError(RuntimeError):
    status: int
    name: str
    call: str
    def __init__(self, status: int, call: str = ...) -> None: ...

def bind(library_handle: int) -> int: ...

@final
class Handle:
    def __new__(cls, device: int) -> Handle: ...
    @property
    def device(self) -> int: ...

@final
class MatmulPlan:
    def __new__(cls, handle: Handle, data_type: int, compute_type: int, trans_a: int, trans_b: int,
                m: int, n: int, k: int, lda: int, ldb: int, ldd: int, batch: int, stride_a: int,
                stride_b: int, stride_d: int, epilogue: int, bias_type: int, workspace_limit: int,
                align_a: int, align_b: int, align_d: int) -> MatmulPlan: ...
    @property
    def workspace_size(self) -> int: ...
    @property
    def epilogue(self) -> int: ...
    @property
    def double_scale(self) -> bool: ...
    @property
    def waves(self) -> float: ...
    def run(self, a: int, b: int, c: int, d: int, bias: int, alpha: float, beta: float, workspace: int,
            workspace_bytes: int, stream: int) -> None: ...

def workspace(device: int, stream: int, nbytes: int) -> DeviceAllocation: ...
def captures_open() -> bool: ...
def capture_workspace(device: int, stream: int, nbytes: int) -> DeviceAllocation | None: ...
def clear_workspaces() -> None: ...
def workspace_count() -> int: ...
