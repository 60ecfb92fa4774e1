# SPDX-License-Identifier: Apache-2.0
"""GraphSet and GraphPool arguments checked before anything touches a GPU."""
import numpy as np
import pytest

import tensorplay as tp
from tensorplay.cuda import GraphSet


def step(x):
    return x


@pytest.mark.parametrize("sizes, error, match", [
    ([], ValueError, "sizes is empty"),
    ([0, 4], ValueError, "positive, got 0"),
    ([2, 2.5], TypeError, "ints, got 2.5"),
    ([True], TypeError, "ints, got True"),
    (5, TypeError, "iterable of ints, got int"),
])
def test_bad_sizes(sizes, error, match):
    with pytest.raises(error, match=match):
        GraphSet(step, [tp.ones((2, 3))], sizes)


def test_samples_must_be_batched_cuda_tensors():
    with pytest.raises(TypeError, match="not callable"):
        GraphSet(3, [tp.ones((2, 3))], [1])
    with pytest.raises(ValueError, match="sample_args is empty"):
        GraphSet(step, [], [1])
    with pytest.raises(TypeError, match=r"sample_args\[0\] is a ndarray"):
        GraphSet(step, [np.ones((2, 3))], [1])
    with pytest.raises(ValueError, match=r"sample_args\[0\] is on cpu.*CUDA tensors"):
        GraphSet(step, [tp.ones((2, 3))], [1])
    with pytest.raises(TypeError, match="sequence of tensors"):
        GraphSet(step, 3, [1])


def test_a_pool_needs_cuda():
    if tp.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(tp.cuda.CudaUnavailableError):
        tp.cuda.GraphPool()
