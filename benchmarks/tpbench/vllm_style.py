# SPDX-License-Identifier: Apache-2.0
"""The serving_set section's PyTorch side (tensorplay's GraphSet is its peer):
vLLM's capture sizes, a batched decode step with per-row positions over the
model of examples/decode_loop.py, and the PyTorch contender, a set of
``torch.cuda.graph`` captures made the way vLLM makes them.

Used by the serving_set section and by capture_set_time.py; none of it
calls tensorplay.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import math
from unittest import mock

from tpbench.common import decode_loop_module


def vllm_sizes(cap=512):
    """vLLM's default capture sizes: 1, 2, 4, every multiple of 8 below 256,
    then every multiple of 16 from 256, up to ``cap`` (51 sizes for 512)."""
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 513, 16))
    return [s for s in sizes if s <= cap]


def size_for(sizes, rows):
    """The smallest of the sorted ``sizes`` holding ``rows`` rows (what a padded call runs)."""
    return sizes[bisect.bisect_left(sizes, rows)]


def padding_waste(padded, largest):
    """(mean, max, n at the max) of (padded(n) - n) / padded(n) over n = 1..largest."""
    waste = [((padded(n) - n) / padded(n), n) for n in range(1, largest + 1)]
    worst = max(waste)
    return sum(w for w, _ in waste) / len(waste), worst[0], worst[1]


# ---------------------------------------------------------------- the decode step

def decode_step(torch, model, max_batch, max_len=256, seed=0):
    """``step(tok, pos) -> logits``: one decode step of decode_loop's model
    ``model`` ("small", "gpt2-small"; its config and random bf16 weights) for
    a batch of ``tok.shape[0] <= max_batch`` rows, each at its own position
    ``pos`` (int64 [b], < max_len). Returns [b, vocab] float32 logits.

    DecodeModel.step itself is not used: it is tied to its own batch and to
    one scalar position shared by every row, so it cannot run on the first b
    rows of a static batch. This is the same computation (layer norms,
    attention over a KV cache with the new token's K/V written at its
    position, GELU MLP, tied LM head over 50257 tokens), batched per row.
    The caches [layers, max_batch, heads, max_len, head_dim] live in the
    closure, pre-filled with random keys and values (a history to attend
    to), and are sliced to the first b rows; rows never read each other's
    cache rows, so padding rows cannot change the real rows' results."""
    dl = decode_loop_module()
    cfg = dl.MODELS[model]
    F = torch.nn.functional
    dev, dtype = "cuda", torch.bfloat16
    w = dl.init_weights(cfg, max_len, dev, dtype, seed)
    c, h = cfg.n_embd, cfg.n_head
    d = c // h
    gen = torch.Generator(device=dev).manual_seed(seed + 1)
    k_cache = torch.empty(cfg.n_layer, max_batch, h, max_len, d, dtype=dtype, device=dev)
    v_cache = torch.empty_like(k_cache)
    for cache in (k_cache, v_cache):
        for layer in cache:                          # per layer: no float32 copy of the whole cache
            layer.normal_(0.0, 1.0, generator=gen)
    positions = torch.arange(max_len, device=dev)
    # the flat row (of [b * h * max_len, d]) of (row, head, position): row_base + head_base + pos
    row_base = torch.arange(max_batch, device=dev) * (h * max_len)
    head_base = torch.arange(h, device=dev) * max_len
    scale = 1.0 / math.sqrt(d)

    def step(tok, pos):
        b = tok.shape[0]
        slots = (row_base[:b].view(b, 1) + head_base.view(1, h) + pos.view(b, 1)).view(b * h)
        masked = positions.view(1, 1, max_len) > pos.view(b, 1, 1)                  # future slots, [b, 1, T]
        x = w.wte.index_select(0, tok) + w.wpe.index_select(0, pos)                 # [b, C]
        for i, lw in enumerate(w.layers):
            a = F.layer_norm(x, (c,), lw["ln1"][0], lw["ln1"][1])
            q, k, v = F.linear(a, lw["attn_w"], lw["attn_b"]).view(b, 3, h, d).unbind(1)   # [b, H, D]
            kc, vc = k_cache[i, :b], v_cache[i, :b]                                 # [b, H, T, D], contiguous
            kc.view(-1, d).index_copy_(0, slots, k.reshape(b * h, d))
            vc.view(-1, d).index_copy_(0, slots, v.reshape(b * h, d))
            x = dl.attend_and_mix(torch, x, q, kc, vc, masked, scale, lw)
        x = F.layer_norm(x, (c,), w.ln_f[0], w.ln_f[1])
        return F.linear(x, w.wte).float()                                           # tied head

    step.__name__ = f"decode_step_{model.replace('-', '_')}"
    return step, cfg


# ---------------------------------------------------------------- vLLM-style PyTorch graphs

# __cuda_array_interface__ type strings; bfloat16 has none: 2-byte integers, viewed back
_TYPESTR = {"float64": "<f8", "float32": "<f4", "float16": "<f2", "bfloat16": "<u2", "int64": "<i8",
            "int32": "<i4", "int16": "<i2", "int8": "|i1", "uint8": "|u1", "bool": "|b1"}


class _DeviceMemory:
    """A device pointer with a shape and byte strides, owning nothing."""

    def __init__(self, ptr, shape, strides, typestr):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": shape, "strides": strides,
                                         "typestr": typestr, "version": 3}


def weak_ref(torch, t):
    """A tensor over ``t``'s memory that does not keep it allocated, as
    vLLM's weak_ref_tensors (a C++ op there; here __cuda_array_interface__):
    once ``t`` is dropped its block goes back to the graph's pool and the
    next capture reuses it, while the graph still writes there on replay."""
    if isinstance(t, (tuple, list)):
        return type(t)(weak_ref(torch, x) for x in t)
    name = str(t.dtype).split(".")[-1]
    shape, strides = tuple(t.shape), tuple(s * t.element_size() for s in t.stride())

    def view(typestr):
        return torch.as_tensor(_DeviceMemory(t.data_ptr(), shape, strides, typestr), device=t.device)
    if name != "bfloat16":
        return view(_TYPESTR[name])
    try:
        raw = view("<u2")
    except (TypeError, ValueError, RuntimeError):    # a torch without uint16 from NumPy type strings
        raw = view("<i2")
    return raw.view(torch.bfloat16)


class VllmStyleGraphs:
    """One ``torch.cuda.graph`` of ``step`` per size in one pool, captured the
    way vLLM's model runner and CUDAGraphWrapper do: static inputs of the
    largest size; gc.collect() then gc.freeze(); for each size, largest
    first, one eager warm-up run on the static rows, a synchronize, then the
    capture with gc.collect and torch.cuda.empty_cache patched to no-ops
    (torch.cuda.graph calls both on entry); only a weak reference to each
    graph's outputs is kept, so their memory is reused by the next capture.
    A call of n rows copies them into the static rows, replays the next
    size's graph and returns its outputs' first n rows (vLLM's padding)."""

    def __init__(self, torch, step, samples, sizes):
        self.sizes = sorted(set(sizes))
        self.statics = [s.clone() for s in samples]      # samples have the largest size's rows
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs, self.outputs = {}, {}
        gc.collect()
        gc.freeze()
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(mock.patch("gc.collect", lambda *a, **k: 0))
                stack.enter_context(mock.patch("torch.cuda.empty_cache", lambda: None))
                for s in reversed(self.sizes):
                    args = [st[:s] for st in self.statics]
                    step(*args)
                    torch.cuda.synchronize()
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, pool=self.pool):
                        out = step(*args)
                    self.outputs[s] = weak_ref(torch, out)
                    self.graphs[s] = g
                    del out                               # the strong output: its blocks go back to the pool
        finally:
            gc.unfreeze()
        torch.cuda.synchronize()

    def __call__(self, *args):
        n = args[0].shape[0]
        s = size_for(self.sizes, n)
        for st, a in zip(self.statics, args):
            st[:n].copy_(a)
        self.graphs[s].replay()
        out = self.outputs[s]
        return type(out)(o[:n] for o in out) if isinstance(out, (tuple, list)) else out[:n]

    def reset(self):
        self.outputs.clear()
        for g in self.graphs.values():
            g.reset()
        self.graphs.clear()
