# Sampling at its edges, against references written out here: the top_p boundary (exactly representable
# probabilities), the vocabulary cap (the last real token drawn, the padded rows never), a completion that
# ends at any of several stop ids (a multi-stop tokenizer), and the stop ids a tokenizer directory names.
# Run: python -m pytest -q tests/test_sampling_edges.py
#
# The models here are "bigram" GPTs: every block's output projection is zero, so the logits depend on the
# last input token only, through a permutation f written into the head: after token i the model says f(i)
# with a logit gap of ~80 (greedy and sampled alike). A completion is then known before sampling it.
import itertools
import json

import pytest
import torch

from model import GPT, GPTConfig
from model import Sampling, generate, sample_next, uniforms
from data.prompts import stop_tokens


def bigram_gpt(f):
    """A GPT whose next token after token i is f[i] (f a permutation of range(len(f)))."""
    V = len(f)
    assert sorted(f) == list(range(V))
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=32, vocab_size=V, n_layer=1, n_head=1, n_embd=V, tie_head=False))
    with torch.no_grad():
        for p in m.transformer.h.parameters():
            p.zero_()  # every block adds 0 to the residual stream: position and context do not matter
        m.transformer.wpe.weight.zero_()
        m.transformer.wte.weight.copy_(torch.eye(V))  # LayerNorm(one-hot i) = a * e_i - b, a > 0
        head = torch.zeros(V, V)
        head[f, list(range(V))] = 20.0  # row f(i) reads coordinate i; each row reads one, so -b shifts all alike
        m.lm_head.weight.copy_(head)
    return m.eval()


def chain(f, start, n):
    out, t = [], start
    for _ in range(n):
        t = f[t]
        out.append(t)
    return out


# ----------------------------------------------------------------------------------------- top_p
@pytest.mark.parametrize("n", [2, 4, 8, 16, 256])
def test_top_p_keeps_the_smallest_set_reaching_it_exactly_at_the_boundary(n):
    """n equally likely tokens (probability 1/n, exact in float32) and top_p = k/n: the nucleus, the smallest
    set whose mass reaches top_p, is exactly k tokens; the (k+1)-th, whose preceding mass equals top_p, is out.
    n = 256 takes top_p up to 255/256: nucleus sampling is off only at top_p = 1."""
    u = (torch.arange(4096, dtype=torch.float32) + 0.5) / 4096  # every part of the unit interval
    for k in range(1, n) if n <= 16 else (1, n // 2, n - 2, n - 1):
        for V in (n, n + 3):  # extra tokens at -inf (masked) must not change the nucleus
            logits = torch.full((4096, V), float("-inf"))
            logits[:, :n] = 0.0
            drawn = sample_next(logits, Sampling(top_p=k / n), u)
            assert len(set(drawn.tolist())) == k, (n, k, V)
            if 4096 % k == 0:  # the kept tokens renormalised evenly: each takes 1/k of the unit interval
                assert (torch.bincount(drawn, minlength=V)[drawn.unique()] == 4096 // k).all(), (n, k)
    # top_p just above a boundary takes one more token, just below it the same number
    logits = torch.zeros(4096, n)
    for k in range(1, min(n, 17)):
        assert len(set(sample_next(logits, Sampling(top_p=k / n + 1e-4), u).tolist())) == k + 1
        assert len(set(sample_next(logits, Sampling(top_p=k / n - 1e-4), u).tolist())) == k


def test_top_p_on_unequal_probabilities_against_the_rule():
    """Unequal probabilities and many top_p: the kept set is the rule written out (token j stays iff the
    mass of the tokens before it is < top_p; the first always). softmax may round a mass by an ulp, so
    top_p values within 1e-6 of a cumulative mass are left to the exact test above."""
    g = torch.Generator().manual_seed(0)
    u = (torch.arange(8192, dtype=torch.float32) + 0.5) / 8192
    for _ in range(20):
        logits = torch.randn(6, generator=g) * 2
        p = logits.softmax(-1).double()
        order = torch.argsort(p, descending=True)
        before = torch.cumsum(p[order], 0) - p[order]
        for top_p in torch.rand(5, generator=g).tolist():
            if (before - top_p).abs().min() < 1e-6:
                continue
            want = {int(order[j]) for j in range(6) if before[j] < top_p or j == 0}
            got = set(sample_next(logits.expand(8192, 6), Sampling(top_p=top_p), u).tolist())
            assert got == want, (logits, top_p)


def test_a_token_of_probability_zero_is_never_drawn_even_at_a_boundary_of_u():
    """Masked tokens (-inf, probability 0) leave flat steps in the cumulative distribution; u exactly on a step
    (0, 1/4, 1/2, 3/4: exact) must still land on a token that has probability."""
    u = torch.tensor([0.0, 0.25, 0.5, 0.75, 1e-9, 0.999999])
    for keep in ([1, 3, 4, 6], [0, 1, 2, 3], [4, 5, 6, 7], [0, 7, 2, 5]):
        logits = torch.full((len(u), 8), float("-inf"))
        logits[:, keep] = 1.5
        for top_p in (None, 0.5):
            drawn = sample_next(logits, Sampling(temperature=0.7, top_p=top_p), u)
            assert set(drawn.tolist()) <= set(keep), (keep, drawn)
            # every kept token drawn (top_p 0.5: two of the four equally likely ones; which two is the sort's)
            assert len(set(drawn.tolist())) == (2 if top_p else 4), (keep, top_p)


# ------------------------------------------------------------------------------------- vocabulary cap
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_vocab_cap_draws_the_last_real_token_and_never_a_padded_row(temperature):
    """Embedding rows beyond the tokenizer (vocab_size) are never drawn; the last real one, vocab_size - 1, is."""
    V = 24
    for vocab in range(3, V):
        f = list(range(V))
        # token 1 -> vocab - 1 (the last real token); token 2 -> a padded row (vocab + 0..), else real
        f[1], f[vocab - 1] = f[vocab - 1], f[1]
        if vocab < V:
            f[2], f[vocab] = f[vocab], f[2]
        m = bigram_gpt(f)
        sampling = Sampling(temperature=temperature, vocab_size=vocab)
        u = uniforms(3, 4, vocab, "cpu")
        idx, _, mask = generate(m, [[1], [2]], 3, (0,), num_samples=2, sampling=sampling, u=u)
        comp = idx[:, -mask.size(1):]
        assert comp[0, 0] == comp[1, 0] == vocab - 1, vocab  # the favourite, and a real token
        assert (comp < vocab).all(), vocab  # after token 2 the favourite is a padded row: something else comes
        assert m.lm_head.weight.size(0) == V


# ------------------------------------------------------------------------------------ several stop ids
STOPS = (13, 14, 15)


def stop_world():
    """f: 1 -> 13; 2 -> 3 -> 14; 4 -> 5 -> 6 -> 15; 7 -> 8 -> 9 -> 10 -> 11 (no stop within 5 tokens)."""
    f = [None] * 16
    for a, b in [(1, 13), (2, 3), (3, 14), (4, 5), (5, 6), (6, 15), (7, 8), (8, 9), (9, 10), (10, 11), (11, 12)]:
        f[a] = b
    rest = iter(sorted(set(range(16)) - {x for x in f if x is not None}))
    return [x if x is not None else next(rest) for x in f]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_completion_ends_at_whichever_stop_id_comes_first(temperature):
    """Each row ends at its own first stop id, whichever of the several it is and wherever it stands in the
    list: mask 1 up to and including it, 0 after, and padding (the list's first id) after it in idx."""
    f = stop_world()
    m = bigram_gpt(f)
    prompts = [[0, 1], [2], [9, 4], [7]]
    for stops in itertools.chain(itertools.permutations(STOPS), [STOPS[:2], (STOPS[2],)]):
        u = uniforms(5, len(prompts) * 2, 1, "cpu")
        idx, _, mask = generate(m, prompts, 5, stops, num_samples=2, sampling=Sampling(temperature=temperature), u=u)
        T = mask.size(1)
        for row in range(len(prompts) * 2):
            want = []
            for t in chain(f, prompts[row // 2][-1], 5):  # the rule written out: up to the first stop id
                want.append(t)
                if t in stops:
                    break
            got = idx[row, -T:].tolist()
            assert got[:len(want)] == want, (stops, row)
            assert mask[row].tolist() == [1] * len(want) + [0] * (T - len(want)), (stops, row)
            assert got[len(want):] == [stops[0]] * (T - len(want)), (stops, row)  # padding after the end


# -------------------------------------------------------------------------------- a directory's stop ids
@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_stop_tokens_are_the_directorys_eos_ids(tmp_path, family):
    """The ids a model directory says end generation (generation_config.json's eos_token_id list, as
    transformers reads it) are the ids sampling stops on, not only <|endoftext|>."""
    pytest.importorskip("transformers", reason="transformers is the test-only reference (installed by .ci/run)")
    from transformers import GenerationConfig
    from hf_dirs import make_dir
    from pretrained.tokenizer import load_hf_tokenizer
    make_dir(str(tmp_path), family)
    want = GenerationConfig.from_pretrained(str(tmp_path)).eos_token_id
    enc = load_hf_tokenizer(str(tmp_path))
    assert len(want) == 2 and set(stop_tokens(enc)) == set(want)
    assert enc.eot_token in stop_tokens(enc)
    for eos in ([want[1]], [want[1], want[0]], want[0]):  # one id, another order, a bare int
        json.dump({**json.load(open(tmp_path / "generation_config.json")), "eos_token_id": eos},
                  open(tmp_path / "generation_config.json", "w"))
        theirs = GenerationConfig.from_pretrained(str(tmp_path)).eos_token_id
        assert set(stop_tokens(load_hf_tokenizer(str(tmp_path)))) == set(theirs if isinstance(theirs, list) else [theirs])


def test_stop_tokens_of_the_task_tokenizer_is_end_of_text():
    import tiktoken
    enc = tiktoken.Encoding("t", pat_str=r"\S+|\s+", mergeable_ranks={bytes([i]): i for i in range(256)},
                            special_tokens={"<|endoftext|>": 256})
    assert stop_tokens(enc) == (256,)
