# SPDX-License-Identifier: Apache-2.0
"""A transformer's decode loop four ways: the whole generation in one graph.

A GPT-2-like decoder-only transformer in plain PyTorch (random bf16 weights,
no download) generates a batch of sequences one token per step from a static
KV cache, sampling on the device without PyTorch's RNG (Gumbel-max over a
counter-based hash of seed, step, row and vocabulary index), until every row
has emitted its end token or ``max_len`` steps ran. Four ways to drive it:

1. PyTorch eager, the host reading "all finished?" after every step;
2. a ``torch.cuda.graph`` of one step replayed from a host loop that reads
   the flag after every replay (how LLM servers do it today);
3. the same, reading the flag only every k steps (overshoots the end);
4. tensorplay: the whole generation in ONE graph, the step's PyTorch code
   captured inside a WHILE node (``with g.while_(keep_going): step()``);
   one ``replay()`` per generation, then one blocking wait.

Method 4 must draw exactly method 2's tokens and method 3 the same up to
each row's end token (the exit status is 1 otherwise); eager PyTorch's are
compared and reported. The state is reset with PyTorch ops outside every
graph before each generation, untimed. Printed per model and batch:
useful tokens/s, the GPU's busy share (steps x one step's GPU time / wall
time), host CPU time per generated token, steps run; then the WHILE node's
cost per iteration against an unrolled graph of the same steps.

Last, where ``transformers`` is installed, a probe captures one decode step
of a small random Hugging Face GPT-2 (built from a config: no download),
with a StaticCache and with a DynamicCache, under ``torch.cuda.graph`` and
under ``tp.cuda.graph``, and compares two replays with eager steps of the
same model from the same state (a cache of its own, the same prefix and
inputs): whether the replay reproduces the captured step, and whether the
next replay, its inputs advanced in place, computes the next step (what a
decode loop needs), logits and cache alike.

Needs a GPU and PyTorch. Run (in a clone: bash scripts/setup.sh, then
.venv/bin/python in place of python):
    python examples/decode_loop.py [--quick] [--models small,gpt2-small] [--batches 1,8] [--json PATH]
    python examples/decode_loop.py --transformers-only     # the probe alone
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import inspect
import json
import math
import statistics
import sys
import time
from typing import Any, Callable, NamedTuple

import tensorplay as tp

try:
    torch: Any = importlib.import_module("torch")          # optional: typed as Any here
except ImportError:
    torch = None

VOCAB = 50257
EOS = VOCAB - 1                  # GPT-2's <|endoftext|>; also the pad of finished rows
DTYPE = "bfloat16"
M32 = 0xFFFFFFFF

METHODS = ("eager", "torch_graph", "torch_graph_every_k", "tensorplay_while")
METHOD_LABELS = {
    "eager": "1 PyTorch eager, host check each step",
    "torch_graph": "2 torch.cuda.graph step, host check each step",
    "torch_graph_every_k": "3 torch.cuda.graph step, host check every k",
    "tensorplay_while": "4 tensorplay: one graph, WHILE node",
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    name: str
    n_layer: int
    n_embd: int
    n_head: int
    vocab: int = VOCAB


MODELS = {
    "small": ModelConfig("small", 4, 512, 8),
    "gpt2-small": ModelConfig("gpt2-small", 12, 768, 12),
}


# ---------------------------------------------------------------- device-side sampling without torch's RNG

def _mix32(x: Any) -> Any:
    """An integer hash of 32-bit values held in an int64 tensor (xorshift-
    multiply, as lowbias32): values in [0, 2**32). The multipliers are below
    2**31, so no product leaves int64's range."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & M32
    x = x ^ (x >> 15)
    x = (x * 0x6B43A9B5) & M32
    return x ^ (x >> 16)


def vocab_hash(vocab: int, device: Any) -> Any:
    """The per-vocabulary-index part of the hash, [vocab] int64 (computed once)."""
    v = torch.arange(vocab, dtype=torch.int64, device=device)
    return _mix32(_mix32((v * 0x9E3779B9) & M32) ^ 0x2545F491)


def hash_uniform(seed: Any, step: Any, rows: Any, vhash: Any) -> Any:
    """Uniform noise in (0, 1), [batch, vocab] float32, a pure function of
    (seed, step, batch row, vocabulary index): ``seed`` and ``step`` are int64
    scalar tensors, ``rows`` int64 [batch, 1] (the row indices), ``vhash``
    what :func:`vocab_hash` returns. Torch ops only (no RNG, no host read), so
    it can be captured into any graph and draws the same numbers eagerly,
    under ``torch.cuda.graph`` and under ``tensorplay.cuda.graph``."""
    s = _mix32(_mix32(seed & M32) ^ (step & M32))                 # scalar
    r = _mix32((s + rows * 0x61C88647) & M32)                     # [batch, 1]
    h = _mix32(r ^ vhash)                                         # [batch, vocab]
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))  # 24 bits: exactly in (0, 1)


def start_tokens(seed: int, batch: int, vocab: int = VOCAB) -> list[int]:
    """One prompt token per row, different per row, never the end token."""
    return [(seed * 1_000_003 + row * 7919 + 12345) % (vocab - 1) for row in range(batch)]


def default_eos_bias(max_len: int, vocab: int = VOCAB) -> float:
    """The end token's logit bias that makes a generation at batch 1 end
    after about half of ``max_len`` steps on average, for these random
    weights (logits nearly uniform over the vocabulary): the end token's
    chance per step p solves (1 - (1 - p)^max_len) / p = max_len / 2, about
    1.594 / max_len; its bias is then log(p / (1 - p) * (vocab - 1)), less a
    little for the spread of the other logits (measured on CPU, see the tests)."""
    p = 1.594 / max_len
    return math.log(p / (1 - p) * (vocab - 1)) - 0.1


# ---------------------------------------------------------------- the model

@dataclasses.dataclass
class Weights:
    wte: Any                     # [vocab, C], tied LM head
    wpe: Any                     # [max_len, C]
    ln_f: tuple[Any, Any]
    layers: list[dict[str, Any]]


def init_weights(cfg: ModelConfig, max_len: int, device: Any, dtype: Any, seed: int = 0) -> Weights:
    """GPT-2's initialization: normal(0, 0.02), the residual projections
    scaled by 1/sqrt(2 n_layer), zero biases, unit LayerNorms."""
    gen = torch.Generator(device=device).manual_seed(seed)
    c = cfg.n_embd

    def normal(*shape: int, std: float = 0.02) -> Any:
        return (torch.randn(*shape, generator=gen, device=device, dtype=torch.float32) * std).to(dtype)

    def zeros(*shape: int) -> Any:
        return torch.zeros(*shape, device=device, dtype=dtype)

    def ln() -> tuple[Any, Any]:
        return torch.ones(c, device=device, dtype=dtype), zeros(c)

    proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)
    layers = [{"ln1": ln(), "attn_w": normal(3 * c, c), "attn_b": zeros(3 * c),
               "proj_w": normal(c, c, std=proj_std), "proj_b": zeros(c), "ln2": ln(),
               "fc_w": normal(4 * c, c), "fc_b": zeros(4 * c),
               "mproj_w": normal(c, 4 * c, std=proj_std), "mproj_b": zeros(c)}
              for _ in range(cfg.n_layer)]
    return Weights(normal(cfg.vocab, c), normal(max_len, c, std=0.01), ln(), layers)


def attend_and_mix(torch: Any, x: Any, q: Any, kc: Any, vc: Any, masked: Any, scale: float, lw: Any) -> Any:
    """The rest of a layer once the new token's K/V are in the cache: attention
    of ``q`` [B, H, D] over ``kc``/``vc`` [B, H, T, D] (``masked`` slots
    excluded, softmax in float32), the projection and the GELU MLP, each
    with its residual; ``x`` [B, C] in, [B, C] out."""
    F = torch.nn.functional
    b, c = x.shape
    scores = torch.matmul(q.unsqueeze(2), kc.transpose(-1, -2)).squeeze(2)             # [B, H, T]
    scores = scores.float().mul_(scale).masked_fill_(masked, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(x.dtype)
    att = torch.matmul(probs.unsqueeze(2), vc).view(b, c)
    x = x + F.linear(att, lw["proj_w"], lw["proj_b"])
    a = F.layer_norm(x, (c,), lw["ln2"][0], lw["ln2"][1])
    m = F.gelu(F.linear(a, lw["fc_w"], lw["fc_b"]), approximate="tanh")
    return x + F.linear(m, lw["mproj_w"], lw["mproj_b"])


class DecodeModel:
    """The model, its weights and its static decode state: every tensor a
    step reads or writes has a fixed address and shape, so one captured
    step works at every position.

    State: ``tok`` [B] the current input token, ``pos`` (int64 scalar) its
    position (also the step's index), the KV caches [layers, B, heads,
    max_len, head_dim], ``finished`` [B], ``tokens`` [B, max_len] (step t's
    token in column t; the end token pads), ``seed`` (int64 scalar),
    ``limit`` (int64 scalar: at most this many steps) and ``keep_going``
    (bool scalar: the WHILE node's predicate)."""

    def __init__(self, cfg: ModelConfig, batch: int, max_len: int, device: Any = "cuda",
                 dtype: Any = None, eos_bias: float | None = None, temperature: float = 1.0,
                 weight_seed: int = 0) -> None:
        dtype = getattr(torch, DTYPE) if dtype is None else dtype
        self.cfg, self.batch, self.max_len, self.device, self.dtype = cfg, batch, max_len, device, dtype
        self.temperature = temperature
        self.eos_bias = default_eos_bias(max_len, cfg.vocab) if eos_bias is None else eos_bias
        self.eos = cfg.vocab - 1
        self.w = init_weights(cfg, max_len, device, dtype, weight_seed)
        h, d = cfg.n_head, cfg.n_embd // cfg.n_head
        i64 = dict(dtype=torch.int64, device=device)
        self.k_cache = torch.zeros(cfg.n_layer, batch, h, max_len, d, dtype=dtype, device=device)
        self.v_cache = torch.zeros_like(self.k_cache)
        self.tok = torch.zeros(batch, **i64)
        self.pos = torch.zeros((), **i64)
        self.seed = torch.zeros((), **i64)
        self.limit = torch.full((), max_len, **i64)
        self.finished = torch.zeros(batch, dtype=torch.bool, device=device)
        self.keep_going = torch.ones((), dtype=torch.bool, device=device)
        self.tokens = torch.full((batch, max_len), self.eos, **i64)
        self.positions = torch.arange(max_len, **i64)
        self.rows = torch.arange(batch, **i64).view(batch, 1)
        self.vhash = vocab_hash(cfg.vocab, device)
        self.bias = torch.zeros(cfg.vocab, dtype=torch.float32, device=device)

    # ------------------------------------------------------------ host side, outside any graph

    def reset(self, seed: int, limit: int | None = None, eos_enabled: bool = True) -> None:
        """A new generation: torch ops outside any graph (not timed by the
        methods below). ``limit`` caps the steps (default ``max_len``);
        ``eos_enabled=False`` makes the end token impossible (fixed-length
        runs for timing)."""
        self.k_cache.zero_()
        self.v_cache.zero_()
        self.pos.zero_()
        self.seed.fill_(seed)
        self.limit.fill_(self.max_len if limit is None else min(limit, self.max_len))
        self.finished.zero_()
        self.keep_going.fill_(True)
        self.tokens.fill_(self.eos)
        self.tok.copy_(torch.tensor(start_tokens(seed, self.batch, self.cfg.vocab), dtype=torch.int64))
        self.bias.zero_()
        self.bias[self.eos] = self.eos_bias if eos_enabled else float("-inf")

    # ------------------------------------------------------------ device side: capturable, no host reads

    def logits(self) -> Any:
        """[B, vocab] float32 logits of the next token, writing this
        position's keys and values into the cache."""
        F = torch.nn.functional
        cfg, w = self.cfg, self.w
        b, c, h = self.batch, cfg.n_embd, cfg.n_head
        d = c // h
        pos1 = self.pos.view(1)
        x = w.wte.index_select(0, self.tok) + w.wpe.index_select(0, pos1)          # [B, C]
        masked = (self.positions > self.pos).view(1, 1, self.max_len)              # future slots
        scale = 1.0 / math.sqrt(d)
        for i, lw in enumerate(w.layers):
            a = F.layer_norm(x, (c,), lw["ln1"][0], lw["ln1"][1])
            q, k, v = F.linear(a, lw["attn_w"], lw["attn_b"]).view(b, 3, h, d).unbind(1)   # [B, H, D]
            kc, vc = self.k_cache[i], self.v_cache[i]                                   # [B, H, T, D]
            kc.index_copy_(2, pos1, k.unsqueeze(2))
            vc.index_copy_(2, pos1, v.unsqueeze(2))
            x = attend_and_mix(torch, x, q, kc, vc, masked, scale, lw)
        x = F.layer_norm(x, (c,), w.ln_f[0], w.ln_f[1])
        return F.linear(x, w.wte).float()                                              # tied head

    def sample(self, logits: Any) -> Any:
        """Gumbel-max: argmax(logits / T + bias + Gumbel noise from the hash), [B] int64."""
        u = hash_uniform(self.seed, self.pos, self.rows, self.vhash)
        gumbel = torch.log(u).neg_().log_().neg_()
        z = (logits + self.bias) * (1.0 / self.temperature) + gumbel
        return torch.argmax(z, dim=-1)

    def step(self) -> None:
        """One decode step for the whole batch: finished rows emit the end token."""
        nxt = self.sample(self.logits())
        nxt.masked_fill_(self.finished, self.eos)
        self.tokens.index_copy_(1, self.pos.view(1), nxt.view(self.batch, 1))
        self.finished.logical_or_(nxt == self.eos)
        self.tok.copy_(nxt)
        self.pos.add_(1)

    def update_keep_going(self) -> None:
        """keep_going = not all finished and pos < limit, on the device."""
        torch.logical_and(self.finished.all().logical_not(), self.pos < self.limit, out=self.keep_going)


# ---------------------------------------------------------------- results of one generation

class Generation(NamedTuple):
    tokens: Any                  # [batch, max_len] int64 on the CPU
    steps: int
    wall_s: float = 0.0
    cpu_s: float = 0.0


def useful_lengths(tokens: Any, eos: int = EOS) -> list[int]:
    """Tokens of each row up to and including its first end token (the whole row without one)."""
    out = []
    for row in tokens.tolist():
        out.append(row.index(eos) + 1 if eos in row else len(row))
    return out


def same_up_to_end(a: Any, b: Any, eos: int = EOS) -> bool:
    """Whether two generations agree on every row up to its end token."""
    la, lb = useful_lengths(a, eos), useful_lengths(b, eos)
    return la == lb and all(a[r, :n].equal(b[r, :n]) for r, n in enumerate(la))


def _sync(model: DecodeModel) -> None:
    if str(model.device).startswith("cuda"):
        torch.cuda.synchronize()


class _Clock:
    """Wall and process CPU time of a block."""

    def __enter__(self) -> _Clock:
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall0
        self.cpu = time.process_time() - self.cpu0


# ---------------------------------------------------------------- the four methods

def generate_eager(model: DecodeModel, seed: int) -> Generation:
    """Method 1: eager PyTorch, the host reads ``finished.all()`` after every step."""
    model.reset(seed)
    _sync(model)
    steps = 0
    with _Clock() as clock:
        while steps < model.max_len:
            model.step()
            steps += 1
            if model.finished.all().item():                  # a host round trip per step
                break
    return Generation(model.tokens.to("cpu", copy=True), steps, clock.wall, clock.cpu)


class TorchGraphDecoder:
    """Methods 2 and 3: one decode step captured with ``torch.cuda.graph``
    (static inputs and outputs, warmed up on a side stream first, as
    PyTorch's documentation says), replayed from a host loop that reads the
    "all finished" flag every ``check_every`` replays."""

    def __init__(self, model: DecodeModel) -> None:
        self.model = model
        self.done = torch.zeros((), dtype=torch.bool, device=model.device)
        model.reset(0)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                model.step()
                self.done.copy_(model.finished.all())
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            model.step()
            self.done.copy_(model.finished.all())

    def generate(self, seed: int, check_every: int = 1) -> Generation:
        model = self.model
        model.reset(seed)
        torch.cuda.synchronize()
        steps = 0
        with _Clock() as clock:
            while steps < model.max_len:
                self.graph.replay()
                steps += 1
                if steps % check_every == 0 and self.done.item():     # a host round trip
                    break
            else:
                torch.cuda.current_stream().synchronize()
        return Generation(model.tokens.to("cpu", copy=True), steps, clock.wall, clock.cpu)


class TensorplayWhileDecoder:
    """Method 4: the whole generation in one tensorplay graph. The step's
    PyTorch code is captured as it is: inside ``tp.cuda.graph`` and inside
    the WHILE body, PyTorch's current stream is the capture stream and its
    allocations go to the graph's pool. ``keep_going`` (not all finished and
    pos < limit) is computed on the device before the loop and at the end of
    each iteration; the WHILE node checks it before every iteration."""

    def __init__(self, model: DecodeModel) -> None:
        self.model = model
        model.reset(0)
        model.step()                                   # load every kernel, make lazy state
        model.update_keep_going()
        torch.cuda.synchronize()
        self.graph = tp.cuda.CUDAGraph()
        with tp.cuda.graph(self.graph):
            model.update_keep_going()
            with self.graph.while_(model.keep_going):
                model.step()
                model.update_keep_going()
        self.done = tp.cuda.Event(blocking=True)

    def launch(self) -> None:
        """One replay, then a blocking wait (the host thread sleeps)."""
        self.graph.replay()
        self.done.record()
        self.done.synchronize()

    def generate(self, seed: int) -> Generation:
        model = self.model
        model.reset(seed)
        torch.cuda.synchronize()
        with _Clock() as clock:
            self.launch()
        return Generation(model.tokens.to("cpu", copy=True), int(model.pos.item()), clock.wall, clock.cpu)


# ---------------------------------------------------------------- GPU time

def gpu_us_per_call(fn: Callable[[], None], calls: int, windows: int = 5,
                    before: Callable[[], None] | None = None) -> float:
    """GPU time of one call of ``fn`` (which launches on the default stream),
    in µs: CUDA events around ``calls`` back-to-back calls queued behind a
    short spin kernel (so the GPU runs them without waiting for the host),
    median over ``windows``; ``before`` runs ahead of each window, untimed."""
    per: list[float] = []
    sleep = getattr(torch.cuda, "_sleep", None)
    for _ in range(windows):
        if before is not None:
            before()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if sleep is not None:
            sleep(2_000_000)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        per.append(float(start.elapsed_time(end)) * 1e3 / calls)
    return statistics.median(per)


def while_overhead(model: DecodeModel, torch_step: TorchGraphDecoder, while_dec: TensorplayWhileDecoder,
                   unroll: int, windows: int = 5) -> dict[str, Any]:
    """GPU µs per step of: method 2's graph replayed back to back; a
    tensorplay graph of ``unroll`` steps unrolled (no conditional node), with
    and without the predicate update; and the WHILE graph run for exactly
    ``unroll`` iterations (limit set, the end token disabled). The WHILE
    figure minus the unrolled-with-predicate one is the node's own cost per
    iteration."""
    u = min(unroll, model.max_len)

    def fixed() -> None:
        model.reset(1, limit=u, eos_enabled=False)
    out: dict[str, Any] = {"unroll": u}
    out["torch_graph_step_us"] = gpu_us_per_call(torch_step.graph.replay, u, windows, fixed)
    for key, with_pred in (("tp_unrolled_step_us", False), ("tp_unrolled_step_pred_us", True)):
        try:
            fixed()
            g = tp.cuda.CUDAGraph()
            with tp.cuda.graph(g):
                for _ in range(u):
                    model.step()
                    if with_pred:
                        model.update_keep_going()
            out[key] = gpu_us_per_call(g.replay, 1, windows, fixed) / u
            del g
        except Exception as exc:       # report, go on
            out[key] = None
            out[key + "_error"] = _describe(exc)
    out["tp_while_iteration_us"] = gpu_us_per_call(while_dec.graph.replay, 1, windows, fixed) / u
    fixed()
    while_dec.launch()
    out["while_iterations_checked"] = int(model.pos.item()) == u
    if out.get("tp_unrolled_step_pred_us") is not None:
        out["while_node_us_per_iteration"] = out["tp_while_iteration_us"] - out["tp_unrolled_step_pred_us"]
    return out


# ---------------------------------------------------------------- one (model, batch) measured

def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def measure(cfg: ModelConfig, batch: int, max_len: int, generations: int, check_every: int = 8,
            eos_bias: float | None = None, unroll: int = 32, first_seed: int = 1,
            log: Callable[[str], None] = print) -> dict[str, Any]:
    """All four methods on one model and batch, ``generations`` generations
    each (seeds ``first_seed`` on, the methods interleaved per seed). Returns
    a dict: ``rows`` (one per method: medians of useful tok/s, GPU busy
    share, host CPU µs per token, steps, overshoot; the mean overshoot),
    ``step_gpu_us``,
    ``while`` (see :func:`while_overhead`), ``errors``, ``mismatches``
    (method 3 or 4 drew other tokens than method 2: a failure) and
    ``eager_mismatches`` (eager PyTorch did: reported only, eager and
    captured kernels may round differently)."""
    model = DecodeModel(cfg, batch, max_len, eos_bias=eos_bias)
    result: dict[str, Any] = {"model": cfg.name, "batch": batch, "max_len": max_len, "generations": generations,
                              "check_every": check_every, "eos_bias": model.eos_bias, "errors": {},
                              "mismatches": [], "eager_mismatches": []}
    runners: dict[str, Callable[[int], Generation]] = {"eager": lambda s: generate_eager(model, s)}
    tg = TorchGraphDecoder(model)
    runners["torch_graph"] = lambda s: tg.generate(s, 1)
    runners["torch_graph_every_k"] = lambda s: tg.generate(s, check_every)
    tw: TensorplayWhileDecoder | None = None
    try:
        tw = TensorplayWhileDecoder(model)
        runners["tensorplay_while"] = tw.generate
    except Exception as exc:
        result["errors"]["tensorplay_while"] = _describe(exc)
        log(f"  tensorplay capture failed: {result['errors']['tensorplay_while']}")
    step_us = gpu_us_per_call(tg.graph.replay, min(64, max_len), 5, lambda: model.reset(1))
    result["step_gpu_us"] = step_us
    for method in list(runners):        # warm up each (first replays load and upload)
        try:
            runners[method](first_seed)
        except Exception as exc:
            result["errors"][method] = _describe(exc)
            del runners[method]
    per: dict[str, list[dict[str, float]]] = {m: [] for m in runners}
    for seed in range(first_seed, first_seed + generations):
        gens: dict[str, Generation] = {}
        for method, run in runners.items():
            try:
                gens[method] = run(seed)
            except Exception as exc:
                result["errors"][method] = _describe(exc)
        ref = gens.get("torch_graph")
        if ref is None:
            continue
        lengths = useful_lengths(ref.tokens, model.eos)
        for method, g in gens.items():
            same = g.tokens.equal(ref.tokens) if method == "tensorplay_while" else \
                same_up_to_end(g.tokens, ref.tokens, model.eos)
            if not same:
                where = result["eager_mismatches" if method == "eager" else "mismatches"]
                where.append({"seed": seed, "method": method, "first_difference": _first_difference(
                    g.tokens, ref.tokens)})
            useful = sum(useful_lengths(g.tokens, model.eos))
            per[method].append({"tok_s": useful / g.wall_s, "busy": g.steps * step_us * 1e-6 / g.wall_s,
                                "cpu_us_tok": g.cpu_s * 1e6 / (g.steps * batch), "steps": g.steps,
                                "overshoot": g.steps - max(lengths), "useful": useful, "wall_ms": g.wall_s * 1e3})
    rows = []
    for method in METHODS:
        samples = per.get(method, [])
        row: dict[str, Any] = {"method": method, "label": METHOD_LABELS[method], "model": cfg.name,
                               "batch": batch, "generations": len(samples), "error": result["errors"].get(method)}
        for key in ("tok_s", "busy", "cpu_us_tok", "steps", "overshoot", "useful", "wall_ms"):
            row[key] = _median([s[key] for s in samples]) if samples else None
        row["overshoot_mean"] = statistics.mean(s["overshoot"] for s in samples) if samples else None
        rows.append(row)
    base = next(r for r in rows if r["method"] == "torch_graph")
    for r in rows:
        ok = r["tok_s"] is not None and base["tok_s"]
        r["tok_s_vs_2"] = r["tok_s"] / base["tok_s"] if ok else None
        r["cpu_vs_2"] = r["cpu_us_tok"] / base["cpu_us_tok"] if ok and base["cpu_us_tok"] else None
    result["rows"] = rows
    if tw is not None:
        try:
            result["while"] = while_overhead(model, tg, tw, unroll)
        except Exception as exc:
            result["errors"]["while_overhead"] = _describe(exc)
    return result


def _first_difference(a: Any, b: Any) -> list[int] | None:
    """[row, step] of the first token where two generations differ."""
    diff = (a != b).nonzero()
    return [int(v) for v in diff[0].tolist()] if len(diff) else None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""


def _describe(exc: BaseException) -> str:
    """``Type: first line``, and the same of the exception it was raised
    while handling, if any (a capture that failed inside, then at its end)."""
    text = f"{type(exc).__name__}: {_first_line(exc)}"
    inner = exc.__cause__ or exc.__context__
    if inner is not None:
        text += f" (while handling {type(inner).__name__}: {_first_line(inner)})"
    return text


# ---------------------------------------------------------------- a Hugging Face transformers decode step

PROBE_PREFIX = 3                 # positions decoded eagerly before the captured step
PROBE_ATOL = PROBE_RTOL = 2e-2   # bf16 rounding; consecutive steps' logits differ by far more (checked)


def probe_tokens(batch: int, vocab: int, steps: int) -> list[list[int]]:
    """The input token of each position, ``[steps][batch]``: fixed, so that
    the graph and its eager reference read the same inputs."""
    return [start_tokens(100 + s, batch, vocab) for s in range(steps)]


def cache_tensors(cache: Any) -> list[Any] | None:
    """The key and value tensors a ``transformers`` cache holds (``layers``
    in recent versions, ``key_cache``/``value_cache`` in older ones), None
    where neither is there."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [t for layer in layers for t in (getattr(layer, "keys", None), getattr(layer, "values", None))]
    keys, values = getattr(cache, "key_cache", None), getattr(cache, "value_cache", None)
    if keys is not None and values is not None:
        return [*keys, *values]
    return None


def compare_logits(got: Any, want: Any) -> tuple[bool, str]:
    """Whether ``got`` equals ``want`` up to bf16 rounding, and how far apart they are, in words."""
    if tuple(got.shape) != tuple(want.shape):
        return False, f"shapes {tuple(got.shape)} and {tuple(want.shape)}"
    if torch.equal(got, want):
        return True, "identical"
    diff = float((got - want).abs().max())
    return bool(torch.allclose(got, want, atol=PROBE_ATOL, rtol=PROBE_RTOL)), f"max |diff| {diff:.3g}"


def compare_caches(got: list[Any] | None, want: list[Any] | None) -> tuple[bool, str]:
    """Whether two snapshots of a cache (see :func:`cache_tensors`) hold the
    same keys and values, and where they differ, in words (the number of
    positions first: a cache that did not grow)."""
    if got is None or want is None:
        return True, "cache not compared (layout unknown)"
    if len(got) != len(want):
        return False, f"{len(got)} cache tensors, eager's {len(want)}"
    for a, b in zip(got, want):
        if a is None or b is None:
            if (a is None) != (b is None):
                return False, "a cache layer is empty on one side only"
            continue
        if tuple(a.shape) != tuple(b.shape):
            if a.dim() == b.dim() >= 2 and a.shape[:-2] == b.shape[:-2] and a.shape[-1] == b.shape[-1]:
                return False, f"cache of {a.shape[-2]} positions, eager's {b.shape[-2]}"
            return False, f"cache shapes {tuple(a.shape)} and {tuple(b.shape)}"
        if not torch.allclose(a.float(), b.float(), atol=PROBE_ATOL, rtol=PROBE_RTOL):
            return False, f"cache contents differ (max |diff| {float((a.float() - b.float()).abs().max()):.3g})"
    return True, "cache the same"


class ProbeDecoder:
    """One ``transformers`` decode step over its own cache, reading static
    inputs (``ids`` [batch, 1] and ``cache_position`` [1]) that are written
    in place between steps, outside any graph, as a decode loop writes them."""

    def __init__(self, tf: Any, model: Any, cache_kind: str, batch: int, max_len: int, device: Any) -> None:
        self.model, self.batch = model, batch
        config = model.config
        if cache_kind == "StaticCache":
            try:
                self.cache = tf.StaticCache(config=config, max_cache_len=max_len)
            except TypeError:                        # transformers 4.x
                self.cache = tf.StaticCache(config=config, max_batch_size=batch, max_cache_len=max_len,
                                            device=device, dtype=model.dtype)
        elif cache_kind == "DynamicCache":
            self.cache = tf.DynamicCache()
        else:
            raise ValueError(f"cache_kind: StaticCache or DynamicCache, got {cache_kind!r}")
        params = inspect.signature(model.forward).parameters
        self.cache_arg = "past_key_values" if "past_key_values" in params else "cache"
        self.ids = torch.zeros(batch, 1, dtype=torch.int64, device=device)
        self.cache_position = torch.zeros(1, dtype=torch.int64, device=device)

    def feed(self, tokens: list[int], position: int) -> None:
        """The next step's inputs: its tokens and its position (the cache's
        own count of positions moves on in the step, where it keeps one)."""
        self.ids.copy_(torch.tensor(tokens, dtype=torch.int64).view(self.batch, 1))
        self.cache_position.fill_(position)

    def step(self) -> Any:
        """[batch, 1, vocab] logits of the fed tokens; writes their keys and values into the cache."""
        with torch.no_grad():
            return self.model(input_ids=self.ids, use_cache=True, cache_position=self.cache_position,
                              **{self.cache_arg: self.cache}).logits


class Captured(NamedTuple):
    replay: Callable[[], None]
    output: Callable[[], Any]    # the captured step's static output
    nodes: str                   # ", N nodes" where the capturer tells


def capture_with_torch(step: Callable[[], Any]) -> Captured:
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step()
    return Captured(g.replay, lambda: out, "")


def capture_with_tensorplay(step: Callable[[], Any]) -> Captured:
    g = tp.cuda.CUDAGraph()
    with tp.cuda.graph(g):
        out = step()
    return Captured(g.replay, lambda: out, f", {g.num_nodes} nodes")


CAPTURERS: dict[str, Callable[[Callable[[], Any]], Captured]] = {
    "torch.cuda.graph": capture_with_torch, "tp.cuda.graph": capture_with_tensorplay}


def _synchronize(device: Any) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def probe_case(tf: Any, cache_kind: str, capture: Callable[[Callable[[], Any]], Captured],
               device: Any = "cuda", batch: int = 2, max_len: int = 64) -> dict[str, Any]:
    """Capture one decode step of a small random GPT2LMHeadModel (2 layers,
    width 256, 4 heads) with ``capture`` and compare two replays with eager
    steps of the same model that start from the same state.

    Both sides build their own cache of kind ``cache_kind`` and decode the
    same ``PROBE_PREFIX`` tokens eagerly (positions 0, 1, 2). The eager
    reference then runs the steps at positions 3 and 4; the graph side
    captures the step at position 3 and replays it twice, its inputs
    written before each replay as the reference's were: the first replay
    must reproduce step 3 (the capture works), the second step 4 (the graph
    moves on with its cache, as a decode loop needs). Logits and the
    cache's keys and values are compared after each. Returns
    ``captured``, ``same_step`` and ``next_step`` (bools, None where not
    reached), ``distinct`` (whether steps 3 and 4 differ at all, so that the
    check can tell them apart), ``decode_step`` (usable in a decode loop)
    and ``result`` (one line); raises what the capture raises."""
    torch.manual_seed(0)
    config = tf.GPT2Config(n_layer=2, n_embd=256, n_head=4, n_positions=max_len)
    model = tf.GPT2LMHeadModel(config).to(device=device, dtype=torch.bfloat16).eval()
    tokens = probe_tokens(batch, config.vocab_size, PROBE_PREFIX + 2)
    steps = (PROBE_PREFIX, PROBE_PREFIX + 1)
    out: dict[str, Any] = {"captured": False, "same_step": None, "next_step": None, "distinct": None,
                           "decode_step": None}

    ref = ProbeDecoder(tf, model, cache_kind, batch, max_len, device)     # the eager reference
    want: list[Any] = []
    want_cache: list[list[Any] | None] = []
    for pos in (*range(PROBE_PREFIX), *steps):
        ref.feed(tokens[pos], pos)
        logits = ref.step()
        if pos in steps:
            want.append(logits.float().clone())
            held = cache_tensors(ref.cache)
            want_cache.append(None if held is None else [None if t is None else t.clone() for t in held])
    _synchronize(device)
    out["distinct"] = not compare_logits(want[0], want[1])[0]

    dec = ProbeDecoder(tf, model, cache_kind, batch, max_len, device)     # the graph's side
    cuda = str(device).startswith("cuda")
    side = torch.cuda.Stream() if cuda else None
    if side is not None:                             # the prefix doubles as the warm-up, on a side stream
        side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        for pos in range(PROBE_PREFIX):
            dec.feed(tokens[pos], pos)
            dec.step()
    if side is not None:
        torch.cuda.current_stream().wait_stream(side)
    _synchronize(device)
    dec.feed(tokens[steps[0]], steps[0])
    captured = capture(dec.step)
    out["captured"] = True
    verdicts: list[str] = []
    for i, pos in enumerate(steps):
        dec.feed(tokens[pos], pos)
        captured.replay()
        _synchronize(device)
        same, logits_words = compare_logits(captured.output().float(), want[i])
        cache_same, cache_words = compare_caches(cache_tensors(dec.cache), want_cache[i])
        out["same_step" if i == 0 else "next_step"] = same and cache_same
        verdicts.append(f"{'yes' if same and cache_same else 'NO'} (logits {logits_words}; {cache_words})")
    out["decode_step"] = bool(out["same_step"] and out["next_step"] and out["distinct"])
    out["result"] = (
        f"captured and replayed{captured.nodes}; replay = eager step {steps[0]} from the same state: "
        f"{verdicts[0]}; next replay, inputs advanced = eager step {steps[1]}: {verdicts[1]}; "
        + ("usable in a decode loop: yes" if out["decode_step"] else
           "usable in a decode loop: no" if out["distinct"] else
           "inconclusive: eager steps 3 and 4 gave the same logits"))
    return out


PROBE_LEGEND = (
    f"transformers capture probe: a random GPT-2 (2 layers, width 256), {PROBE_PREFIX} tokens decoded eagerly, "
    f"then the step at position {PROBE_PREFIX} captured; each replay is compared with an eager step of the same "
    f"model from the same state (its own cache, the same prefix and inputs): logits within bf16 rounding, and "
    f"the cache's keys and values. The next replay's inputs are written in place first, as a decode loop "
    f"writes them; a graph usable in a decode loop reproduces that next step too.")


def probe_transformers(batch: int = 2, max_len: int = 64) -> list[dict[str, Any]]:
    """:func:`probe_case` for a StaticCache and a DynamicCache, each captured
    with ``torch.cuda.graph`` and with ``tp.cuda.graph``. Each entry says
    what happened: the exception's type and first line, or what the replays
    gave against eager steps from the same state. Never raises."""
    out: list[dict[str, Any]] = []
    try:
        tf = importlib.import_module("transformers")
    except Exception as exc:
        return [{"case": "import transformers", "cache": "", "capturer": "", "transformers": "",
                 "result": f"not importable ({type(exc).__name__}: {_first_line(exc)})"}]
    version = getattr(tf, "__version__", "?")
    for cache_kind in ("StaticCache", "DynamicCache"):
        for name, capture in CAPTURERS.items():
            case = f"transformers {version} GPT-2 decode step, {cache_kind}, {name}"
            entry: dict[str, Any] = {"case": case, "cache": cache_kind, "capturer": name, "transformers": version,
                                     "captured": False}
            try:
                entry.update(probe_case(tf, cache_kind, capture, "cuda", batch, max_len))
            except Exception as exc:
                entry["result"] = _describe(exc)
            try:
                torch.cuda.synchronize()
            except Exception as exc:
                entry["result"] += f" (then synchronize raised {type(exc).__name__}: {_first_line(exc)})"
            out.append(entry)
    return out


# ---------------------------------------------------------------- output

def print_results(results: list[dict[str, Any]], check_every: int) -> None:
    head = (f"{'method':<46} {'model':<10} {'batch':>5} {'useful tok/s':>12} {'GPU busy':>9} "
            f"{'CPU us/tok':>10} {'steps':>10} {'tok/s vs 2':>10} {'CPU vs 2':>9}")
    print(head)
    print("-" * len(head))

    def cell(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    for res in results:
        for r in res["rows"]:
            steps = cell(r["steps"], ".0f")
            if r["method"] == "torch_graph_every_k" and r["overshoot_mean"] is not None:
                steps += f" (+{r['overshoot_mean']:.1f})"
            label = r["label"].replace("every k", f"every {check_every}")
            line = (f"{label:<46} {r['model']:<10} {r['batch']:>5} {cell(r['tok_s'], '.0f'):>12} "
                    f"{cell(None if r['busy'] is None else r['busy'] * 100, '.1f') + '%':>9} "
                    f"{cell(r['cpu_us_tok'], '.1f'):>10} {steps:>10} {cell(r['tok_s_vs_2'], '.2f'):>10} "
                    f"{cell(r['cpu_vs_2'], '.2f'):>9}")
            print(line + (f"  error: {r['error']}" if r["error"] else ""))
        w = res.get("while")
        if w:
            print(f"  GPU us per step ({res['model']}, batch {res['batch']}, {w['unroll']} steps): "
                  f"torch graph {w['torch_graph_step_us']:.1f}; tensorplay unrolled "
                  f"{cell(w.get('tp_unrolled_step_us'), '.1f')}, unrolled + predicate "
                  f"{cell(w.get('tp_unrolled_step_pred_us'), '.1f')}; WHILE per iteration "
                  f"{w['tp_while_iteration_us']:.1f} (node's own cost "
                  f"{cell(w.get('while_node_us_per_iteration'), '.2f')})")
            for key in ("tp_unrolled_step_us_error", "tp_unrolled_step_pred_us_error"):
                if w.get(key):
                    print(f"  {key[:-6]}: {w[key]}")
            if not w["while_iterations_checked"]:
                print(f"  the WHILE graph did not run exactly {w['unroll']} iterations: its timing is off")
        for key, err in res["errors"].items():
            if key not in METHODS:
                print(f"  {key}: {err}")
        if res["mismatches"]:
            print(f"  TOKENS DIFFER from method 2's: {res['mismatches'][:8]}")
        if res["eager_mismatches"]:
            print(f"  eager PyTorch drew other tokens than the graphs (rounding): {res['eager_mismatches'][:8]}")
    print("useful tok/s: tokens up to and including each row's end token over the generation's wall time "
          "(state reset before, untimed); GPU busy: steps x one step's GPU time (CUDA events around "
          "back-to-back replays of method 2's graph) over wall time; CPU us/tok: process CPU time over "
          "steps x batch; medians over the generations; (+n): mean steps run past the end (method 3).")


def tokens_agree(results: list[dict[str, Any]]) -> bool:
    """Method 4 identical to method 2 and method 3 equal to it up to each row's end, everywhere."""
    return not any(res["mismatches"] for res in results)


def _parse_list(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 generations, max_len 128")
    ap.add_argument("--models", default="small,gpt2-small", help=f"of {','.join(MODELS)}")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--max-len", type=int, default=None, help="default 256 (128 with --quick)")
    ap.add_argument("--generations", type=int, default=None, help="default 10 (3 with --quick)")
    ap.add_argument("--check-every", type=int, default=8, help="method 3's k")
    ap.add_argument("--eos-bias", type=float, default=None, help="default: a mean length of about max_len / 2")
    ap.add_argument("--unroll", type=int, default=32, help="steps of the unrolled graph")
    ap.add_argument("--no-transformers", action="store_true", help="skip the transformers capture probe")
    ap.add_argument("--transformers-only", action="store_true",
                    help="run only the transformers capture probe (no decode-loop measurements)")
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = ap.parse_args(argv)
    if args.no_transformers and args.transformers_only:
        ap.error("--no-transformers and --transformers-only exclude each other")
    models = _parse_list(args.models)
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        ap.error(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    batches = [int(b) for b in _parse_list(args.batches)]
    max_len = args.max_len or (128 if args.quick else 256)
    generations = args.generations or (3 if args.quick else 10)
    if not tp.cuda.is_available():
        print(f"No CUDA GPU here ({tp.cuda.unavailable_reason()}): the decode loop needs one.")
        return 0
    if torch is None:
        print("PyTorch is not installed: the decode loop needs it (pip install torch).")
        return 0
    if not torch.cuda.is_available():
        print("PyTorch sees no CUDA GPU (a CPU-only build?): the decode loop needs one.")
        return 0
    print(f"GPU: {tp.cuda.get_device_name(0)}; torch {torch.__version__}; tensorplay {tp.__version__}; "
          f"max_len {max_len}, {generations} generations per method, check every {args.check_every}")
    t0 = time.perf_counter()
    results = []
    for name in [] if args.transformers_only else models:
        for batch in batches:
            print(f"measuring {name} at batch {batch} ...", flush=True)
            results.append(measure(MODELS[name], batch, max_len, generations, args.check_every,
                                   args.eos_bias, args.unroll))
            torch.cuda.empty_cache()
    if results:
        print()
        print_results(results, args.check_every)
    probes = [] if args.no_transformers else probe_transformers()     # last: a failed capture may leave junk
    if probes:
        print(PROBE_LEGEND)
    for p in probes:
        print(f"{p['case']}: {p['result']}")
    agree = tokens_agree(results)
    if results:
        print("tokens: method 4 identical to method 2, method 3 equal up to each end token:",
              "yes" if agree else "NO", "; eager PyTorch too:",
              "yes" if not any(res["eager_mismatches"] for res in results) else "no (see above)")
    if args.json:
        meta = {"gpu": tp.cuda.get_device_name(0), "torch": torch.__version__, "tensorplay": tp.__version__,
                "max_len": max_len, "generations": generations, "check_every": args.check_every,
                "quick": args.quick, "elapsed_s": round(time.perf_counter() - t0, 1)}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results, "transformers": probes}, f, indent=1)
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
