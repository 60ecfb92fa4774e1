# SPDX-License-Identifier: Apache-2.0
"""A ``torch.compile``d decode step four ways, side by side in one process (issue 44).

The step is examples/decode_loop.py's GPT-2-like decoder (plain PyTorch,
random bf16 weights, static KV cache, the position an int64 tensor on the
device), decoding greedily: logits, argmax, the token written at the
position, the position advanced and ``keep_going = pos < limit`` set, all
in one function compiled with ``torch.compile(step, mode=..., dynamic=False,
fullgraph=True)`` and warmed up (compiled, autotuned) before any capture.
One generation is ``--tokens`` N steps from the same starting state:

(a) host loop: a Python loop calling the compiled step each token, as
    users do today;
(b) tensorplay graph: the compiled step captured once with
    ``tp.cuda.graph``, replayed from the host per token;
(c) tensorplay WHILE: the compiled step captured inside ``g.while_(keep_going)``
    (the stopping condition, a token counter against a limit, computed on
    the device): one replay runs all N tokens, no host round trip;
(d) ``torch.cuda.graph`` of the compiled step, replayed per token.

The host loops (a), (b) and (d) read ``keep_going`` (``.item()``, a host
round trip) every ``--check-every`` tokens (1: every token, as a loop
checking for its end does; 0: never, the N launches queued back to back).
Every generation ends with one wait on a blocking event. Run from
benchmarks/ on the GPU machine::

    python compiled_decode.py [--tokens 64] [--rounds 5] [--model small] [--mode default]
        [--batch 1] [--max-len 256] [--check-every 1] [--json PATH]

Measured per variant, medians over ``--rounds`` rounds, the variants
interleaved in each round (state reset before each generation, untimed):
tokens/s (N x batch over the generation's wall time), host CPU µs per
token (``time.process_time()`` over the generation / (N x batch)), GPU µs
per token (CUDA events around back-to-back generations queued behind a spin
kernel, tpbench.common.gpu_per_call, / N), and the ratios against (a) and
(d) as medians of the rounds' ratios. Correctness: after every timed
generation (b), (c) and (d) must give (a)'s token ids exactly and its last
logits within bf16 tolerance (the exit status is 1 otherwise); eager
uncompiled PyTorch is compared once and reported only (Inductor may round
differently). Without a GPU, PyTorch or Triton it says why in one line and
exits 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from typing import Any

import tensorplay as tp
from tpbench.common import (TOLERANCE, decode_loop_module, gpu_and_torch, gpu_per_call, make_clocks,
                            relative_error, torch_graph, write_json)

torch: Any = None                # imported by main() once a GPU is known to be here

SEED = 1
VARIANTS = ("host_loop", "tp_graph", "tp_while", "torch_graph")
LABELS = {
    "host_loop": "(a) compiled step, host loop",
    "tp_graph": "(b) tp.cuda.graph of the step, replay/token",
    "tp_while": "(c) tp WHILE node, N tokens a replay",
    "torch_graph": "(d) torch.cuda.graph of the step, replay/token",
}
MODES = ("default", "max-autotune-no-cudagraphs")


class GreedyDecoder:
    """decode_loop.DecodeModel decoding greedily: ``step()`` (the function
    compiled) reads and writes only the model's static tensors and
    ``last_logits``, so that one captured step is right at every position."""

    def __init__(self, dl: Any, cfg: Any, batch: int, max_len: int, tokens: int, device: Any = "cuda") -> None:
        self.dl = dl
        self.model = dl.DecodeModel(cfg, batch, max_len, device=device)
        self.tokens = tokens
        self.start = self.model.tok.new_tensor(dl.start_tokens(SEED, batch, cfg.vocab))
        self.last_logits = torch.zeros(batch, cfg.vocab, dtype=torch.float32, device=device)

    def step(self) -> None:
        m = self.model
        logits = m.logits()
        nxt = torch.argmax(logits, dim=-1)
        m.tokens.index_copy_(1, m.pos.view(1), nxt.view(m.batch, 1))
        m.tok.copy_(nxt)
        m.pos.add_(1)
        self.last_logits.copy_(logits)
        m.keep_going.copy_(m.pos < m.limit)

    def reset(self) -> None:
        """The starting state, outside every graph (untimed): caches, token
        buffer and logits cleared, position 0, the start tokens, limit N."""
        self.model.reset(SEED, limit=self.tokens)
        self.last_logits.zero_()

    def restart(self) -> None:
        """Position 0 and the start tokens again, three small kernels queued
        without a host wait (the GPU-time batches: stale cache slots past
        the position are masked, so the steps are the same work)."""
        m = self.model
        m.pos.zero_()
        m.tok.copy_(self.start)
        m.keep_going.fill_(True)

    def result(self) -> tuple[Any, Any, int]:
        """(token ids [batch, N], last logits [batch, vocab]) as copies, and the position reached."""
        return self.model.tokens[:, :self.tokens].clone(), self.last_logits.clone(), int(self.model.pos.item())


def host_loop(launch: Any, keep_going: Any, tokens: int, check_every: int) -> Any:
    """A generation from the host: ``launch()`` N times, reading ``keep_going``
    every ``check_every`` launches (0: never) and stopping where it is false."""
    def run() -> None:
        for i in range(1, tokens + 1):
            launch()
            if check_every and i % check_every == 0 and not keep_going.item():
                break
    return run


def build_variants(dec: GreedyDecoder, step: Any, check_every: int) -> tuple[dict, dict, dict]:
    """({variant: one generation with host checks}, {variant: one generation
    without them, for GPU time}, {"errors": {variant: why its capture
    failed}, "notes": {variant: its graph's nodes}}); the graphs are
    captured here, after the compiled step was warmed up. A variant whose
    capture failed is left out, the others measured."""
    m, n, describe = dec.model, dec.tokens, dec.dl._describe
    launch: dict[str, Any] = {"host_loop": step}
    errors: dict[str, str] = {}
    notes: dict[str, str] = {}
    try:
        g1 = tp.cuda.CUDAGraph()
        with tp.cuda.graph(g1):
            step()
        launch["tp_graph"] = g1.replay
        notes["tp_graph"] = f"{g1.num_nodes} nodes"
    except Exception as exc:       # reported in the table
        errors["tp_graph"] = describe(exc)
    try:
        gw = tp.cuda.CUDAGraph()
        with tp.cuda.graph(gw):
            m.keep_going.copy_(m.pos < m.limit)
            with gw.while_(m.keep_going):
                step()
        notes["tp_while"] = f"{gw.num_nodes} nodes"
    except Exception as exc:
        errors["tp_while"] = describe(exc)
        gw = None
    try:
        gt, _ = torch_graph(torch, step)
        launch["torch_graph"] = gt.replay
    except Exception as exc:
        errors["torch_graph"] = describe(exc)
    checked = {v: host_loop(f, m.keep_going, n, check_every) for v, f in launch.items()}
    queued = {v: host_loop(f, m.keep_going, n, 0) for v, f in launch.items()}
    if gw is not None:
        checked["tp_while"] = queued["tp_while"] = gw.replay
    order = [v for v in VARIANTS if v in checked]
    return ({v: checked[v] for v in order}, {v: queued[v] for v in order}, {"errors": errors, "notes": notes})


def compare(got: tuple[Any, Any, int], want: tuple[Any, Any, int]) -> dict[str, Any]:
    """Token ids identical, the same position reached and the last logits
    within bf16 tolerance of ``want``'s (GreedyDecoder.result()'s)."""
    same = bool(torch.equal(got[0], want[0])) and got[2] == want[2]
    err = relative_error(got[1], want[1], torch)
    out: dict[str, Any] = {"tokens_equal": same, "logits_rel_err": err,
                           "ok": same and err <= TOLERANCE["bfloat16"]}
    if got[2] != want[2]:
        out["position"] = [got[2], want[2]]
    diff = (got[0] != want[0]).nonzero()
    if len(diff):
        out["first_difference"] = [int(v) for v in diff[0].tolist()]
    return out


def describe_difference(check: dict[str, Any]) -> str:
    parts = []
    if "first_difference" in check:
        parts.append(f"first at [row, step] {check['first_difference']}")
    if "position" in check:
        parts.append(f"position {check['position'][0]}, (a)'s {check['position'][1]}")
    return "; ".join(parts)


def measure(args: argparse.Namespace, dl: Any) -> dict[str, Any]:
    cfg = dl.MODELS[args.model]
    dec = GreedyDecoder(dl, cfg, args.batch, args.max_len, args.tokens)
    n, per_gen = args.tokens, args.tokens * args.batch
    result: dict[str, Any] = {"rows": [], "checks": []}

    dec.reset()     # eager, uncompiled: reported only (it also loads the kernels of the WHILE predicate)
    for _ in range(n):
        dec.step()
    eager = dec.result()

    step = torch.compile(dec.step, mode=None if args.mode == "default" else args.mode, dynamic=False,
                         fullgraph=True)
    t0 = time.perf_counter()
    dec.reset()
    for _ in range(3):                              # compile, autotune, load: never inside a capture
        step()
    torch.cuda.synchronize()
    result["compile_s"] = time.perf_counter() - t0
    checked, queued, info = build_variants(dec, step, args.check_every)
    result.update(info)

    done = tp.cuda.Event(blocking=True)

    def generate(variant: str) -> tuple[float, float]:
        dec.reset()
        torch.cuda.synchronize()
        wall0, cpu0 = time.perf_counter(), time.process_time()
        checked[variant]()
        done.record()
        done.synchronize()
        return time.perf_counter() - wall0, time.process_time() - cpu0

    for v in checked:                               # warm-up generation: first replays upload
        generate(v)
    per: dict[str, list[dict[str, float]]] = {v: [] for v in checked}
    for r in range(args.rounds):
        ref = None
        for v in checked:
            wall, cpu = generate(v)
            per[v].append({"tok_s": per_gen / wall, "cpu_us": cpu * 1e6 / per_gen, "wall_ms": wall * 1e3})
            got = dec.result()
            if v == "host_loop":
                ref = got
                if r == 0:
                    result["eager_vs_compiled"] = compare(got, eager)
            elif ref is not None:
                result["checks"].append({"round": r, "variant": v, **compare(got, ref)})

    clocks = make_clocks(torch)

    def batch_of_generations(v: str) -> Any:
        def gen() -> None:
            dec.restart()
            queued[v]()
        return gen
    gpu = gpu_per_call([(v, batch_of_generations(v), clocks["PyTorch"]) for v in queued], args.rounds,
                       target_ms=40.0, min_calls=2, max_calls=10)

    def ratio(v: str, base: str, key: str) -> float | None:
        if base not in per or v not in per:
            return None
        return statistics.median(a[key] / b[key] for a, b in zip(per[v], per[base]))

    for v in VARIANTS:
        row: dict[str, Any] = {"variant": v, "label": LABELS[v], "model": args.model, "batch": args.batch,
                               "tokens": n, "max_len": args.max_len, "mode": args.mode,
                               "check_every": args.check_every, "error": result["errors"].get(v),
                               "note": result["notes"].get(v)}
        if v in per:
            for key in ("tok_s", "cpu_us", "wall_ms"):
                row[key] = statistics.median(s[key] for s in per[v])
            gpu_us, host_us, behind = gpu[v]
            row.update(gpu_us=gpu_us / n, gpu_behind=behind, tok_s_vs_a=ratio(v, "host_loop", "tok_s"),
                       tok_s_vs_d=ratio(v, "torch_graph", "tok_s"), cpu_vs_d=ratio(v, "torch_graph", "cpu_us"))
            checks = [c for c in result["checks"] if c["variant"] == v]
            row["same_as_a"] = all(c["ok"] for c in checks) if checks else None
            row["logits_rel_err"] = max((c["logits_rel_err"] for c in checks), default=None)
        result["rows"].append(row)
    return result


def print_table(result: dict[str, Any]) -> None:
    head = (f"{'variant':<48} {'tok/s':>9} {'vs (a)':>7} {'vs (d)':>7} {'CPU us/tok':>10} "
            f"{'CPU vs (d)':>10} {'GPU us/tok':>10} {'same as (a)':>11}")
    print(head)
    print("-" * len(head))

    def cell(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    for r in result["rows"]:
        if r.get("tok_s") is None:
            print(f"{r['label']:<48} not measured: {r['error']}")
            continue
        same = "ref" if r["variant"] == "host_loop" else {True: "yes", False: "NO", None: "-"}[r["same_as_a"]]
        print(f"{r['label']:<48} {r['tok_s']:>9.0f} {cell(r['tok_s_vs_a'], '.2f'):>7} "
              f"{cell(r['tok_s_vs_d'], '.2f'):>7} {r['cpu_us']:>10.1f} {cell(r['cpu_vs_d'], '.3f'):>10} "
              f"{r['gpu_us']:>9.1f}{'*' if r['gpu_behind'] else ' '} {same:>11}"
              + (f"  ({r['note']})" if r["note"] else ""))
    e = result.get("eager_vs_compiled")
    if e is not None:
        print(f"eager uncompiled PyTorch against (a): tokens {'identical' if e['tokens_equal'] else 'differ'}, "
              f"last logits max error {e['logits_rel_err']:.1e} of the largest (reported only)")
    for c in result["checks"]:
        if not c["ok"]:
            print(f"  round {c['round']}, {LABELS[c['variant']]}: tokens "
                  f"{'equal' if c['tokens_equal'] else 'DIFFER: ' + describe_difference(c)}, "
                  f"logits max error {c['logits_rel_err']:.1e}")
    print("tok/s: N x batch over one generation's wall time (reset untimed); vs (a), vs (d): medians of the "
          "rounds' ratios; CPU us/tok: process CPU time / (N x batch); GPU us/tok: CUDA events around "
          "back-to-back generations behind a spin kernel, / N (*: the host fell behind the GPU in a round, "
          "so this includes idle gaps); same as (a): identical token ids and last logits within "
          f"{TOLERANCE['bfloat16']:.0e} in every round.")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=64, help="N, tokens a generation (default 64)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--model", default="small", choices=("small", "gpt2-small"),
                    help="decode_loop's small (4 layers, width 512; default) or gpt2-small (12, 768)")
    ap.add_argument("--mode", default="default", choices=MODES, help="torch.compile's mode")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--max-len", type=int, default=256, help="KV cache length, at least --tokens")
    ap.add_argument("--check-every", type=int, default=1,
                    help="host loops read keep_going every k tokens (0: never; default 1)")
    ap.add_argument("--json", metavar="PATH", help="write the rows as JSON")
    args = ap.parse_args(argv)
    if args.tokens < 1 or args.rounds < 1 or args.batch < 1 or args.check_every < 0:
        ap.error("--tokens, --rounds and --batch must be positive, --check-every not negative")
    if args.tokens > args.max_len:
        ap.error(f"--tokens {args.tokens} does not fit the KV cache (--max-len {args.max_len})")
    return args


def main(argv: list[str] | None = None) -> int:
    global torch
    args = parse_args(argv)
    torch, code = gpu_and_torch("the decode step is PyTorch code, compiled with torch.compile",
                                missing_torch_exit=0)
    if torch is None:
        return code
    if not torch.cuda.is_available():
        print("PyTorch sees no CUDA GPU (a CPU-only build?): the compiled decode step needs one.")
        return 0
    if importlib.util.find_spec("triton") is None:
        print("Triton is not installed: torch.compile's Inductor needs it for CUDA kernels.")
        return 0
    dl = decode_loop_module()
    print(f"GPU: {tp.cuda.get_device_name(0)}; torch {torch.__version__}; tensorplay {tp.__version__}; "
          f"model {args.model}, batch {args.batch}, {args.tokens} tokens a generation, max_len {args.max_len}, "
          f"mode {args.mode}, {args.rounds} rounds, host check every {args.check_every}", flush=True)
    t0 = time.perf_counter()
    with torch.no_grad():
        result = measure(args, dl)
    print(f"compiled and warmed up in {result['compile_s']:.1f} s")
    print()
    print_table(result)
    ok = all(c["ok"] for c in result["checks"]) and not result["errors"]
    if args.json:
        meta = {"gpu": tp.cuda.get_device_name(0), "torch": torch.__version__, "tensorplay": tp.__version__,
                "args": vars(args), "compile_s": result["compile_s"], "errors": result["errors"],
                "eager_vs_compiled": result.get("eager_vs_compiled"), "checks": result["checks"],
                "elapsed_s": round(time.perf_counter() - t0, 1)}
        write_json(args.json, meta, result["rows"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
