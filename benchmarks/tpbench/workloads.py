# SPDX-License-Identifier: Apache-2.0
"""The serving MLP step, which the serving and serving_set sections both run.

An MLP step as in an LLM server's decode, bfloat16, hidden 1024 -> 4096 ->
1024: ``y = x + linear(gelu(linear(x, w1, b1)), w2, b2)``; its weights and
two 512-row inputs as float32 NumPy arrays (the same values for both
libraries), tensorplay's step (bias and GELU fused into the matmuls) and
PyTorch's.
"""

from __future__ import annotations

import numpy as np

import tensorplay as tp

# vLLM's default capture sizes: 1, 2, 4, then every multiple of 8 up to 512
SERVING_BATCHES = [1, 2, 4] + list(range(8, 513, 8))
SERVING_HIDDEN, SERVING_FFN = 1024, 4096


def serving_weights(seed=100):
    """bf16 MLP weights (as float32 arrays) and two 512-row inputs: one for
    warm-up and capture, one written before the checked replay."""
    rng = np.random.default_rng(seed)
    h, f = SERVING_HIDDEN, SERVING_FFN

    def uniform(shape, scale):
        return ((rng.random(shape, dtype=np.float32) * 2 - 1) * np.float32(scale))
    return {"w1": uniform((f, h), h ** -0.5), "b1": uniform((f,), 0.1), "w2": uniform((h, f), f ** -0.5),
            "b2": uniform((h,), 0.1), "x": uniform((max(SERVING_BATCHES), h), 1.0),
            "x_new": uniform((max(SERVING_BATCHES), h), 1.0)}


def tp_mlp_step(w):
    """y = x + linear(gelu(linear(x, w1, b1)), w2, b2), bias and GELU fused."""
    def step(x):
        h = tp.linear(x, w["w1"], w["b1"], activation="gelu")
        return tp.linear(h, w["w2"], w["b2"]) + x
    return step


def torch_mlp_step(torch, w):
    F = torch.nn.functional

    def step(x):
        h = F.gelu(F.linear(x, w["w1"], w["b1"]), approximate="tanh")
        return F.linear(h, w["w2"], w["b2"]) + x
    return step
