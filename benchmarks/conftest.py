# SPDX-License-Identifier: Apache-2.0
import pytest

import tensorplay as tp


def pytest_collection_modifyitems(config, items):
    if not tp.cuda.is_available():
        skip = pytest.mark.skip(reason=f"benchmarks need a CUDA GPU: {tp.cuda.unavailable_reason()}")
        for item in items:
            item.add_marker(skip)
