# SPDX-License-Identifier: Apache-2.0
"""Section ``decode``: examples/decode_loop.py's measurements, a transformer's
decode loop four ways (compare.py runs it last).
"""

from __future__ import annotations

from tpbench.common import decode_loop_module, record


def decode_rows(quick, torch):
    """A transformer's decode loop, four ways (examples/decode_loop.py's
    measure()): models small and gpt2-small at batch 1 and 8, max_len 128
    and 3 generations per method with --quick (256 and 10 without). A row
    per method: host us = host CPU us per generated token, latency us = wall
    time of one generation, gpu_us = one step's GPU time (method 2's graph),
    rate = useful tokens/s, the rest in the note; then the GPU time per step
    of the unrolled and WHILE graphs, and the transformers capture probe."""
    section = "decode"
    if torch is None:
        record(section, "all", "PyTorch", error="PyTorch is not installed: the decode section needs it")
        return
    decode_loop = decode_loop_module()
    max_len, generations = (128, 3) if quick else (256, 10)
    for name in ("small", "gpt2-small"):
        for batch in (1, 8):
            case = f"{name} b{batch} L{max_len}"
            try:
                res = decode_loop.measure(decode_loop.MODELS[name], batch, max_len, generations, check_every=8,
                                          log=lambda _line: None)
            except Exception as exc:    # reported, not fatal
                record(section, case, "all methods", error=f"{type(exc).__name__}: {exc}"[:200])
                continue
            for r in res["rows"]:
                note = "-"
                if r["tok_s"] is not None:
                    note = (f"{r['tok_s']:.0f} useful tok/s, GPU busy {r['busy']:.0%}, {r['steps']:.0f} steps"
                            + (f" (+{r['overshoot_mean']:.1f} past the end)"
                               if r["method"] == "torch_graph_every_k" else "")
                            + f", tok/s x{r['tok_s_vs_2']:.2f} and CPU x{r['cpu_vs_2']:.2f} vs method 2")
                record(section, case, r["label"].replace("every k", "every 8"), host_us=r["cpu_us_tok"],
                       latency_us=None if r["wall_ms"] is None else r["wall_ms"] * 1e3, gpu_us=res["step_gpu_us"],
                       rate=r["tok_s"], unit="tok/s", note=note, extra=r, error=r["error"])
            w = res.get("while")
            if w:
                def us(key):
                    return "-" if w.get(key) is None else f"{w[key]:.1f}"
                record(section, case, "GPU us/step: WHILE iteration vs unrolled", gpu_us=w["tp_while_iteration_us"],
                       extra=w, note=(f"torch graph {us('torch_graph_step_us')}, tp unrolled "
                                      f"{us('tp_unrolled_step_us')}, + predicate {us('tp_unrolled_step_pred_us')}, "
                                      f"WHILE iteration {us('tp_while_iteration_us')} ({w['unroll']} steps)"))
            for key, err in res["errors"].items():
                if key not in decode_loop.METHODS:
                    record(section, case, key, error=err[:200])
            if res["mismatches"]:
                record(section, case, "token check",
                       error=f"tokens differ from method 2's: {res['mismatches'][:3]}"[:200])
            torch.cuda.empty_cache()
    for p in decode_loop.probe_transformers():   # last: a failed capture may leave junk behind
        record(section, "transformers", f"{p['cache']}, {p['capturer']}".strip(", ") or p["case"],
               note=p["result"][:300], extra=p)
