# SPDX-License-Identifier: Apache-2.0
"""examples/decode_loop.py: without a GPU it says so in one line and exits
0; its pure pieces run on CPU PyTorch where PyTorch is installed (the
counter-based noise, the Gumbel-max sampler, the cached decode step against
a full causal forward pass, an eager generation, and the transformers
probe's comparison with stand-in capturers where transformers is
installed); on a GPU a tiny run checks that the four methods draw the same
tokens, and the probe runs with both real capturers."""

import importlib.util
import math
import subprocess
import sys

import pytest

from helpers import HAS_CUDA, ROOT

EXAMPLE = ROOT / "examples" / "decode_loop.py"
HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def _run_example(*args, timeout=120):
    return subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, cwd="/",
                          timeout=timeout)


@pytest.fixture(scope="module")
def dl():
    """The example, imported as compare.py imports it."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import decode_loop
    finally:
        sys.path.remove(str(ROOT / "examples"))
    return decode_loop


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch", reason="PyTorch is not installed: the CPU checks of the model need it")


@pytest.mark.skipif(HAS_CUDA, reason="a GPU is here: test_tiny_run_on_the_gpu runs the example instead")
@pytest.mark.parametrize("args", [(), ("--transformers-only",)])
def test_without_a_gpu_the_example_says_so_and_exits_0(args):
    res = _run_example(*args)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1, res.stdout
    assert lines[0].startswith("No CUDA GPU here (") and lines[0].endswith("): the decode loop needs one."), lines
    assert res.stderr == ""


def test_unknown_model_is_a_usage_error(dl, capsys):
    with pytest.raises(SystemExit) as info:
        dl.main(["--models", "small,nope"])
    assert info.value.code == 2
    assert "unknown nope" in capsys.readouterr().err


def test_the_probe_alone_and_no_probe_exclude_each_other(dl, capsys):
    with pytest.raises(SystemExit) as info:
        dl.main(["--transformers-only", "--no-transformers"])
    assert info.value.code == 2
    assert "exclude each other" in capsys.readouterr().err


def test_useful_lengths_and_comparison(dl, torch):
    eos = 9
    a = torch.tensor([[1, 2, eos, eos], [3, 4, 5, 6], [eos, eos, eos, eos]])
    assert dl.useful_lengths(a, eos) == [3, 4, 1]
    b = a.clone()
    b[0, 3] = 7                               # after row 0's end: not useful
    assert dl.same_up_to_end(a, b, eos)
    b[1, 2] = 8
    assert not dl.same_up_to_end(a, b, eos)


def test_start_tokens_differ_per_row_and_are_never_the_end_token(dl):
    for seed in range(5):
        toks = dl.start_tokens(seed, 64)
        assert len(set(toks)) == 64
        assert all(0 <= t < dl.EOS for t in toks)


def test_eos_bias_gives_the_intended_chance_per_step(dl):
    """Over uniform logits the end token's chance per step is p = 1.594 / max_len
    (a mean length of max_len / 2 after truncation), less the small correction."""
    for max_len in (128, 256):
        b = dl.default_eos_bias(max_len)
        p = math.exp(b) / (math.exp(b) + dl.VOCAB - 1)
        assert 0.85 < p * max_len / 1.594 < 1.0
        assert abs((1 - (1 - 1.594 / max_len) ** max_len) / (1.594 / max_len) / (max_len / 2) - 1) < 0.01


def test_hash_noise_is_deterministic_uniform_and_depends_on_every_input(dl, torch):
    vh = dl.vocab_hash(1000, "cpu")
    rows = torch.arange(8).view(8, 1)

    def u(seed, step, r=rows):
        return dl.hash_uniform(torch.tensor(seed), torch.tensor(step), r, vh)

    a = u(1, 0)
    assert a.shape == (8, 1000) and a.dtype == torch.float32
    assert torch.equal(a, u(1, 0))                            # a pure function
    assert 0 < a.min().item() and a.max().item() < 1          # open interval
    assert abs(a.mean().item() - 0.5) < 0.01
    assert abs(a.var().item() - 1 / 12) < 0.005
    for other in (u(2, 0), u(1, 1), u(1, 0, rows + 8)):        # seed, step, row
        assert (other != a).float().mean().item() > 0.99
    assert len(set(a[0].tolist())) > 990                       # vocabulary index
    # no correlation between neighbouring rows, steps or seeds
    for other in (a.roll(1, 0), u(1, 1), u(2, 0)):
        x, y = a.flatten() - 0.5, other.flatten() - 0.5
        assert abs((x * y).mean().item() / (x * x).mean().item()) < 0.03


def _tiny(dl, torch, batch=3, max_len=16, vocab=97, **kw):
    cfg = dl.ModelConfig("tiny", 2, 32, 4, vocab=vocab)
    return dl.DecodeModel(cfg, batch, max_len, device="cpu", dtype=torch.float32, **kw)


def test_gumbel_max_samples_the_softmax(dl, torch):
    m = _tiny(dl, torch, batch=4000, max_len=4, vocab=5)
    m.reset(7)
    m.bias.zero_()
    logits = torch.tensor([0.0, 1.0, -1.0, 2.0, 0.5]).expand(4000, 5)
    counts = torch.zeros(5)
    for step in range(4):
        m.pos.fill_(step)
        counts += torch.bincount(m.sample(logits), minlength=5)
    freq = counts / counts.sum()
    want = torch.softmax(logits[0], 0)
    assert (freq - want).abs().max().item() < 0.015, (freq, want)
    m.pos.fill_(0)
    assert torch.equal(m.sample(logits), m.sample(logits))    # no RNG state: the same draw again


def _full_forward(model, torch, seq):
    """[B, T, vocab] logits of a causal forward pass over the whole sequence, no cache."""
    F = torch.nn.functional
    w, cfg = model.w, model.cfg
    b, t = seq.shape
    c, h = cfg.n_embd, cfg.n_head
    x = w.wte[seq] + w.wpe[:t]
    for lw in w.layers:
        a = F.layer_norm(x, (c,), *lw["ln1"])
        q, k, v = (z.transpose(1, 2) for z in F.linear(a, lw["attn_w"], lw["attn_b"]).view(b, t, 3, h, c // h)
                   .unbind(2))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + F.linear(att, lw["proj_w"], lw["proj_b"])
        a = F.layer_norm(x, (c,), *lw["ln2"])
        x = x + F.linear(F.gelu(F.linear(a, lw["fc_w"], lw["fc_b"]), approximate="tanh"), lw["mproj_w"],
                         lw["mproj_b"])
    return F.linear(F.layer_norm(x, (c,), *w.ln_f), w.wte)


def test_cached_decode_step_matches_a_full_causal_forward(dl, torch):
    m = _tiny(dl, torch, batch=3, max_len=12)
    m.reset(3)
    seq = torch.randint(0, 96, (3, 12), generator=torch.Generator().manual_seed(0))
    want = _full_forward(m, torch, seq)
    for t in range(12):
        m.tok.copy_(seq[:, t])
        m.pos.fill_(t)
        got = m.logits()
        assert got.shape == (3, 97) and got.dtype == torch.float32
        assert torch.allclose(got, want[:, t], atol=1e-5, rtol=1e-4), t


def test_eager_generation_on_cpu(dl, torch):
    m = _tiny(dl, torch, batch=6, max_len=16, eos_bias=2.5)
    g = dl.generate_eager(m, 11)
    assert g.tokens.shape == (6, 16) and g.tokens.dtype == torch.int64
    lengths = dl.useful_lengths(g.tokens, m.eos)
    assert g.steps == max(lengths) == int(m.pos.item())
    assert any(n < 16 for n in lengths)
    for row, n in zip(g.tokens.tolist(), lengths):
        assert m.eos not in row[:n - 1]
        if m.eos in row:                                      # finished rows keep emitting the end token
            assert all(tok == m.eos for tok in row[n - 1:])
    assert m.finished.all().item() or g.steps == 16
    m.update_keep_going()
    assert m.keep_going.item() == (not m.finished.all().item() and g.steps < 16)
    again = dl.generate_eager(m, 11)                          # the same seed draws the same tokens
    assert torch.equal(again.tokens, g.tokens) and again.steps == g.steps
    assert not torch.equal(dl.generate_eager(m, 12).tokens, g.tokens)


def test_limit_and_disabled_end_token_give_fixed_length_runs(dl, torch):
    m = _tiny(dl, torch, batch=2, max_len=16, eos_bias=50.0)
    m.reset(1, limit=5, eos_enabled=False)
    steps = 0
    m.update_keep_going()
    while m.keep_going.item():
        m.step()
        m.update_keep_going()
        steps += 1
    assert steps == 5 and not m.finished.any().item()
    assert (m.tokens[:, :5] != m.eos).all().item() and (m.tokens[:, 5:] == m.eos).all().item()


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_TORCH, reason="PyTorch is not installed")
def test_tiny_run_on_the_gpu(tmp_path):
    """The four methods on the small model for one short generation: exit
    status 0 means method 4 drew exactly method 2's tokens and method 3 the
    same up to each end token."""
    out = tmp_path / "decode.json"
    res = _run_example("--models", "small", "--batches", "1,4", "--max-len", "24", "--generations", "2",
                       "--unroll", "4", "--no-transformers", "--json", str(out), timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    import json
    data = json.loads(out.read_text())
    for r in data["results"]:
        assert not r["mismatches"] and not r["errors"], r
        measured = {row["method"] for row in r["rows"] if row["tok_s"]}
        assert measured == {"eager", "torch_graph", "torch_graph_every_k", "tensorplay_while"}


# ------------------------------------------------------------------ the transformers probe

def test_probe_comparisons(dl, torch):
    a = torch.tensor([[1.0, -2.0, 0.5]])
    assert dl.compare_logits(a, a.clone()) == (True, "identical")
    ok, words = dl.compare_logits(a + 0.01, a)                    # bf16 rounding
    assert ok and words == "max |diff| 0.01"
    ok, words = dl.compare_logits(a + torch.tensor([[0.0, 0.3, 0.0]]), a)
    assert not ok and words == "max |diff| 0.3"
    assert not dl.compare_logits(a, a.view(1, 1, 3))[0]
    k = torch.ones(2, 4, 5, 8)
    assert dl.compare_caches([k, k], [k.clone(), k.clone()]) == (True, "cache the same")
    assert dl.compare_caches([k[:, :, :4], k], [k, k]) == (False, "cache of 4 positions, eager's 5")
    ok, words = dl.compare_caches([k, k * 2], [k, k])
    assert not ok and words.startswith("cache contents differ")
    assert dl.compare_caches(None, [k])[0]                        # a layout the probe cannot read
    assert not dl.compare_caches([None, k], [k, k])[0]


class _Layers:
    def __init__(self, *layers):
        self.layers = layers


class _Layer:
    def __init__(self, keys, values):
        self.keys, self.values = keys, values


class _OldCache:
    def __init__(self, keys, values):
        self.key_cache, self.value_cache = keys, values


def test_cache_tensors_reads_both_layouts(dl, torch):
    k0, v0, k1, v1 = (torch.full((1,), float(i)) for i in range(4))
    assert dl.cache_tensors(_Layers(_Layer(k0, v0), _Layer(k1, v1))) == [k0, v0, k1, v1]
    assert dl.cache_tensors(_OldCache([k0, k1], [v0, v1])) == [k0, k1, v0, v1]
    assert dl.cache_tensors(object()) is None


def _replays_the_step(dl):
    """A stand-in capturer that "replays" by running the step eagerly: a perfect graph."""
    def capture(step):
        held = {}
        return dl.Captured(lambda: held.update(out=step()), lambda: held["out"], ", stand-in")
    return capture


def _replays_the_first_result(dl):
    """A stand-in capturer whose replays all give the first replay's result: a graph that does not move on."""
    def capture(step):
        held = {}

        def replay():
            if "out" not in held:
                held["out"] = step()
        return dl.Captured(replay, lambda: held["out"], "")
    return capture


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed: the probe's CPU check needs it")
@pytest.mark.parametrize("cache_kind", ["StaticCache", "DynamicCache"])
def test_probe_compares_like_with_like(dl, torch, cache_kind):
    """The eager reference starts from the state the graph captured from, so
    a perfect replay matches both steps, and a graph that does not move on
    fails the second, on logits and on the cache."""
    import transformers
    good = dl.probe_case(transformers, cache_kind, _replays_the_step(dl), device="cpu")
    assert {k: good[k] for k in ("captured", "same_step", "next_step", "distinct", "decode_step")} == \
        {"captured": True, "same_step": True, "next_step": True, "distinct": True, "decode_step": True}, good
    assert good["result"].endswith("usable in a decode loop: yes"), good["result"]
    stuck = dl.probe_case(transformers, cache_kind, _replays_the_first_result(dl), device="cpu")
    assert stuck["same_step"] is True and stuck["next_step"] is False and stuck["decode_step"] is False, stuck
    assert "eager step 4: NO (logits max |diff|" in stuck["result"], stuck["result"]
    assert stuck["result"].endswith("usable in a decode loop: no")


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_TORCH, reason="PyTorch is not installed")
@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed: nothing to probe")
def test_transformers_probe_on_the_gpu(tmp_path):
    """The probe with both real capturers: every case either raises (the
    same for both) or captures, and then its first replay reproduces the
    eager step it was captured from; tensorplay's verdicts are PyTorch's."""
    out = tmp_path / "probe.json"
    res = _run_example("--transformers-only", "--json", str(out), timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    import json
    probes = json.loads(out.read_text())["transformers"]
    assert [(p["cache"], p["capturer"]) for p in probes] == [
        (c, k) for c in ("StaticCache", "DynamicCache") for k in ("torch.cuda.graph", "tp.cuda.graph")], probes
    keys = ("captured", "same_step", "next_step", "decode_step")
    for torch_case, tp_case in zip(probes[::2], probes[1::2]):
        assert [torch_case.get(k) for k in keys] == [tp_case.get(k) for k in keys], (torch_case, tp_case)
        if tp_case["captured"]:
            assert tp_case["same_step"] is True and tp_case["distinct"] is True, tp_case
    for p in probes:
        assert f"{p['case']}: {p['result']}" in res.stdout
