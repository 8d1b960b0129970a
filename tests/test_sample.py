# Tests for sample.py (pad_prompts, sample_next, generate, decode_completions).
# Hermetic: tiny random GPTs on CPU; the real tokenizer is built offline into a temporary dir.
# Run with: python -m pytest tests/test_sample.py -q
#
# Independent references used:
#   - batched generation: the same prompt generated alone (no padding, batch of one);
#   - num_samples: the num_samples=1 output repeated; rows of a prompt must be adjacent;
#   - seeded sampling: a second run with the same seed / a run with another seed;
#   - end-of-text mask: a first "free" run with an end-of-text id that is never emitted tells
#     which tokens each row emits; the second run's mask/padding are derived from it by hand;
#   - top_k=1 and tiny top_p: greedy decoding (temperature=0);
#   - sample_next filters: torch.topk membership and a nucleus computed here with a sort + cumsum;
#   - decode_completions: tokenizer.decode of the tokens cut by hand at the first end-of-text.
import pytest
import torch

from configurator import cli_main
from data.prompts import decode_completions
from model import GREEDY, Sampling, generate, pad_prompts, sample_next, uniforms

PROMPTS = [[5, 17, 3], [8, 1, 44, 23, 9, 30, 2, 11, 7], [42], [13, 26, 39, 4, 0]]
NEVER = 49   # an end-of-text id that sharp_gpt does not emit for PROMPTS within 20 steps (checked)


def free_run(model, prompts, n):
    """Greedy completions (N, n) with an end-of-text id that is never emitted."""
    idx, _, mask = generate(model, prompts, n, NEVER, sampling=GREEDY)
    assert idx.size(1) == max(map(len, prompts)) + n and bool(mask.all()), "test setup: NEVER was emitted"
    return idx[:, -n:]


# ------------------------------------------------------------------------------------------
# batched == alone

@pytest.mark.parametrize("eot_from", [None, (0, 4), (1, 7)])
def test_batched_greedy_equals_each_prompt_alone(sharp_gpt, eot_from):
    n = 20
    if eot_from is None:
        eot = NEVER
    else:  # end-of-text = the token that row r emits at step k of a free run: rows stop at various steps
        r, k = eot_from
        eot = free_run(sharp_gpt, PROMPTS, n)[r, k].item()
    idx, pad_left, mask = generate(sharp_gpt, PROMPTS, n, eot, sampling=GREEDY)
    T = mask.size(1)
    P = max(map(len, PROMPTS))
    assert idx.shape == (len(PROMPTS), P + T)
    assert pad_left.tolist() == [P - len(p) for p in PROMPTS]
    lengths = []
    for b, p in enumerate(PROMPTS):
        assert idx[b, P - len(p):P].tolist() == p
        alone, alone_pad, alone_mask = generate(sharp_gpt, [p], n, eot, sampling=GREEDY)
        Ta = alone_mask.size(1)
        assert Ta <= T and alone_pad.tolist() == [0]
        assert idx[b, -T:][:Ta].tolist() == alone[0, -Ta:].tolist()
        assert mask[b, :Ta].tolist() == alone_mask[0].tolist()
        # what the lone run did not generate (it had stopped) is padding in the batch
        assert (idx[b, -T:][Ta:] == eot).all() and (mask[b, Ta:] == 0).all()
        lengths.append(int(mask[b].sum()))
    if eot_from is not None:
        assert len(set(lengths)) > 1, "test setup: every row stopped at the same step"


# ------------------------------------------------------------------------------------------
# num_samples

def test_num_samples_greedy_rows_adjacent_and_identical(sharp_gpt):
    ns, n = 3, 12
    idx1, pad1, mask1 = generate(sharp_gpt, PROMPTS, n, NEVER, sampling=GREEDY)
    idx, pad_left, mask = generate(sharp_gpt, PROMPTS, n, NEVER, num_samples=ns, sampling=GREEDY)
    P = max(map(len, PROMPTS))
    assert idx.shape == (len(PROMPTS) * ns, P + n)
    assert mask.shape == (len(PROMPTS) * ns, n)
    assert torch.equal(idx, idx1.repeat_interleave(ns, dim=0))
    assert torch.equal(mask, mask1.repeat_interleave(ns, dim=0))
    assert pad_left.tolist() == [P - len(p) for p in PROMPTS for _ in range(ns)]


def test_num_samples_sampled_rows_of_a_prompt_are_adjacent(tiny_gpt):
    ns, n = 4, 10
    u = uniforms(n, len(PROMPTS) * ns, 0, "cpu")
    idx, pad_left, mask = generate(tiny_gpt, PROMPTS, n, NEVER, num_samples=ns, u=u)
    P = max(map(len, PROMPTS))
    assert idx.shape == (len(PROMPTS) * ns, P + n)
    for row in range(idx.size(0)):
        p = PROMPTS[row // ns]
        assert idx[row, P - len(p):P].tolist() == p
        assert pad_left[row].item() == P - len(p)
    # samples of one prompt are not all copies of each other (the cache is shared, not the draws)
    for b in range(len(PROMPTS)):
        rows = idx[b * ns:(b + 1) * ns, P:]
        assert len({tuple(r) for r in rows.tolist()}) > 1


def test_num_samples_with_top_k_1_equals_greedy(sharp_gpt):
    greedy, _, gmask = generate(sharp_gpt, PROMPTS, 15, NEVER, num_samples=2, sampling=GREEDY)
    u = uniforms(15, len(PROMPTS) * 2, 3, "cpu")
    sampled, _, smask = generate(sharp_gpt, PROMPTS, 15, NEVER, num_samples=2, sampling=Sampling(top_k=1), u=u)
    assert torch.equal(sampled, greedy) and torch.equal(smask, gmask)


# ------------------------------------------------------------------------------------------
# seeds

def test_seeded_sampling_is_reproducible(tiny_gpt):
    kw = dict(max_new_tokens=20, eot_id=NEVER, num_samples=2)
    rows = len(PROMPTS) * 2
    torch.manual_seed(100)
    a = generate(tiny_gpt, PROMPTS, u=uniforms(20, rows, 7, "cpu"), **kw)
    torch.manual_seed(200)                      # the global RNG state must not matter
    b = generate(tiny_gpt, PROMPTS, u=uniforms(20, rows, 7, "cpu"), **kw)
    c = generate(tiny_gpt, PROMPTS, u=torch.rand(20, rows, generator=torch.Generator().manual_seed(7)), **kw)
    d = generate(tiny_gpt, PROMPTS, u=uniforms(20, rows, 8, "cpu"), **kw)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    for x, y in zip(a, c):
        assert torch.equal(x, y)
    assert not torch.equal(a[0], d[0])
    # a seed gives uniforms its own generator: the global RNG is neither used nor reseeded
    state = torch.get_rng_state()
    generate(tiny_gpt, PROMPTS, u=uniforms(20, rows, 7, "cpu"), **kw)
    assert torch.equal(torch.get_rng_state(), state)


# ------------------------------------------------------------------------------------------
# end-of-text and the completion mask

def test_completion_mask_and_padding_after_eot(sharp_gpt):
    n = 20
    free = free_run(sharp_gpt, PROMPTS, n).tolist()
    eot = free[0][4]                             # row 0 emits it at step <= 4
    firsts = [row.index(eot) if eot in row else None for row in free]
    assert any(f is None or f > 4 for f in firsts), "test setup: all rows stop together"
    idx, _, mask = generate(sharp_gpt, PROMPTS, n, eot, sampling=GREEDY)
    T = mask.size(1)
    # generation may stop once every row has finished; T never drops below that point
    assert (n if None in firsts else max(firsts) + 1) <= T <= n
    comp = idx[:, -T:].tolist()
    for b, f in enumerate(firsts):
        if f is None:
            assert comp[b] == free[b][:T] and mask[b].tolist() == [1] * T
        else:
            assert comp[b][:f + 1] == free[b][:f + 1]                # same tokens up to the eot...
            assert comp[b][f] == eot
            assert comp[b][f + 1:] == [eot] * (T - f - 1)              # ...then only eot (padding)
            assert mask[b].tolist() == [1] * (f + 1) + [0] * (T - f - 1)
    assert 0 in mask.tolist()[0], "test setup: row 0 should have padding after its eot"


@pytest.mark.parametrize("check_every", [1, 8])  # 1: the CPU default; 8: the CUDA default
def test_generation_stops_calling_the_model_once_all_rows_finished(sharp_gpt, monkeypatch, check_every):
    prompt = PROMPTS[1]
    free = free_run(sharp_gpt, [prompt], 20)[0].tolist()
    eot = free[6]
    f = free.index(eot)
    calls = []
    real_forward = sharp_gpt.forward

    def counting_forward(*args, **kwargs):
        calls.append(args[0].shape)
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(sharp_gpt, "forward", counting_forward)
    greedy = Sampling(temperature=0, check_every=check_every)
    idx, _, mask = generate(sharp_gpt, [prompt], 20, eot, sampling=greedy)
    assert mask.size(1) == f + 1                          # columns after the last eot are dropped
    assert idx[0, len(prompt):].tolist() == free[:f + 1]
    assert mask.tolist() == [[1] * (f + 1)]
    # one prefill of the prompt, then one call per step until the first "all done?" check after the
    # eot: asked every check_every steps (t = k*check_every - 1), so at most check_every - 1 are wasted
    t_stop = min(-(-(f + 1) // check_every) * check_every - 1, 19)
    assert calls == [(1, len(prompt))] + [(1, 1)] * t_stop


# ------------------------------------------------------------------------------------------
# top_k / top_p

@pytest.mark.parametrize("kw", [dict(top_k=1), dict(top_p=1e-6), dict(top_k=1, temperature=0.5),
                                dict(top_p=1e-6, temperature=2.0)])
def test_top_k_1_and_tiny_top_p_equal_greedy(sharp_gpt, tiny_gpt, kw):
    for model in (sharp_gpt, tiny_gpt):
        greedy = generate(model, PROMPTS, 15, NEVER, sampling=GREEDY)
        u = uniforms(15, len(PROMPTS), 0, "cpu")
        sampled = generate(model, PROMPTS, 15, NEVER, sampling=Sampling(**kw), u=u)
        for x, y in zip(greedy, sampled):
            assert torch.equal(x, y)


def test_sample_next_top_k_membership():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4, 50, generator=g)
    logits = base.repeat(500, 1)                           # 2000 draws, 500 per distinct row
    k = 5
    u = torch.rand(len(logits), generator=torch.Generator().manual_seed(1))
    draws = sample_next(logits, Sampling(top_k=k), u)
    assert draws.shape == (2000,) and draws.dtype == torch.long
    allowed = torch.topk(logits, k, dim=-1).indices
    assert (allowed == draws[:, None]).any(-1).all()
    for row in range(4):
        seen = set(draws[row::4].tolist())
        assert seen <= set(allowed[row].tolist())
        # with 500 draws, a token of the top 5 that is never drawn would mean a too-narrow filter
        probs = base[row].softmax(-1)[allowed[row]]
        probs = probs / probs.sum()
        assert seen == {t for t, p in zip(allowed[row].tolist(), probs.tolist()) if p > 0.02}


def test_sample_next_top_p_membership():
    g = torch.Generator().manual_seed(2)
    base = torch.randn(3, 50, generator=g)
    logits = base.repeat(400, 1)
    top_p = 0.6
    u = torch.rand(len(logits), generator=torch.Generator().manual_seed(3))
    draws = sample_next(logits, Sampling(top_p=top_p), u)
    for row in range(3):
        probs = base[row].double().softmax(-1)
        order = probs.argsort(descending=True).tolist()
        nucleus, mass = set(), 0.0
        for t in order:                       # smallest prefix of the sorted tokens with mass >= top_p
            nucleus.add(t)
            mass += probs[t].item()
            if mass >= top_p:
                break
        assert len(nucleus) > 3, "test setup: the nucleus is too small to test anything"
        seen = set(draws[row::3].tolist())
        assert seen <= nucleus
        assert seen >= {t for t in nucleus if probs[t] / mass > 0.03}   # not narrower either


def test_sample_next_temperature_zero_is_argmax():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(4))
    assert torch.equal(sample_next(logits, GREEDY), logits.argmax(-1))


# ------------------------------------------------------------------------------------------
# errors and return types

@pytest.mark.parametrize("prompts", [[[]], [[1, 2], []], []])
def test_empty_prompt_raises(tiny_gpt, prompts):
    with pytest.raises(AssertionError):
        generate(tiny_gpt, prompts, 5, NEVER)


@pytest.mark.parametrize("n", [0, -3])
def test_no_new_tokens_raises(tiny_gpt, n):
    with pytest.raises(AssertionError, match="max_new_tokens"):
        generate(tiny_gpt, [[1, 2]], n, NEVER)


def test_prompt_plus_new_tokens_beyond_block_size_raises(tiny_gpt):
    with pytest.raises(AssertionError, match="max_new_tokens=5 > 64"):
        generate(tiny_gpt, [[1] * 60], 5, NEVER)
    with pytest.raises(AssertionError):
        generate(tiny_gpt, [[1] * 3, [2] * 60], 5, NEVER)       # the longest prompt counts
    idx, _, mask = generate(tiny_gpt, [[1] * 60], 4, NEVER, sampling=GREEDY)   # exactly 64: fine
    assert idx.shape == (1, 64)


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_generate_returns_token_ids_and_masks_only(tiny_gpt, temperature):
    tiny_gpt.train()
    u = uniforms(6, len(PROMPTS) * 2, 0, "cpu")
    out = generate(tiny_gpt, PROMPTS, 6, NEVER, num_samples=2, sampling=Sampling(temperature=temperature), u=u)
    assert tiny_gpt.training                     # the caller's mode is restored
    assert isinstance(out, tuple) and len(out) == 3
    idx, pad_left, mask = out
    for t in out:
        assert isinstance(t, torch.Tensor)
        assert t.dtype == torch.long
        assert not t.requires_grad
    assert idx.shape == (8, 9 + mask.size(1)) and pad_left.shape == (8,) and mask.shape[0] == 8
    assert ((mask == 0) | (mask == 1)).all()


def test_pad_prompts_layout():
    idx, pad_left = pad_prompts([[1, 2, 3], [4]], pad=9, device="cpu")
    assert idx.tolist() == [[1, 2, 3], [9, 9, 4]]
    assert pad_left.tolist() == [0, 2]


# ------------------------------------------------------------------------------------------
# decode_completions with the real tokenizer

@pytest.fixture(scope="module")
def enc(tmp_path_factory):
    from data.datadir import load_tokenizer
    from data.gsm_synth.prepare import prepare
    data_dir = prepare(steps=1, max_operand=5, ops="+", n_train=300, n_val=20, n_test=20, num_merges=20,
                       verbose=False, root=str(tmp_path_factory.mktemp("d")))
    return load_tokenizer(data_dir)


def test_decode_completions_strips_eot_and_padding(enc):
    eot = enc.eot_token
    prompts = [enc.encode("Mia has 3 apples.\n"), enc.encode("Sam?\n")]
    comps = ["3+2=5\n#### 5", "#### 12"]
    toks = [enc.encode(c) + [eot] for c in comps]
    T = max(map(len, toks)) + 2
    rows, masks = [], []
    for p, t in zip(prompts, toks):
        pad = max(map(len, prompts)) - len(p)
        rows.append([eot] * pad + p + t + [eot] * (T - len(t)))
        masks.append([1] * len(t) + [0] * (T - len(t)))
    texts = decode_completions(enc, torch.tensor(rows), torch.tensor(masks))
    assert texts == comps
    # a row without end-of-text (ran out of tokens) keeps everything
    row = torch.tensor([prompts[1] + enc.encode("#### 7")])
    assert decode_completions(enc, row, torch.ones(1, len(enc.encode("#### 7")), dtype=torch.long)) == ["#### 7"]


def test_decode_completions_of_generated_rows(enc, make_gpt):
    model = make_gpt(seed=0, emb_scale=10.0, block_scale=10.0, vocab_size=enc.n_vocab)
    eot = enc.eot_token
    prompts = [enc.encode("Mia has 3 apples.\n"), enc.encode("How many?\n")]
    idx, _, mask = generate(model, prompts, 12, eot, num_samples=2, u=uniforms(12, 4, 0, "cpu"))
    T = mask.size(1)
    expected = []
    for row in idx[:, -T:].tolist():
        cut = row[:row.index(eot)] if eot in row else row
        expected.append(enc.decode(cut))
    assert decode_completions(enc, idx, mask) == expected


def test_check_every_changes_nothing_within_a_call(sharp_gpt):
    """Asking "all rows done?" every 8 steps (the CUDA default) only adds padding steps after every
    row has ended: ids, pad_left and mask equal asking every step, greedy and sampled alike."""
    eot = free_run(sharp_gpt, PROMPTS[:1], 20)[0, 4].item()  # an id some rows emit early
    u = uniforms(20, len(PROMPTS) * 3, 3, "cpu")
    for temperature, kw in ((0, {}), (1.0, dict(num_samples=3, u=u))):
        a = generate(sharp_gpt, PROMPTS, 20, eot, sampling=Sampling(temperature, check_every=1), **kw)
        b = generate(sharp_gpt, PROMPTS, 20, eot, sampling=Sampling(temperature, check_every=8), **kw)
        assert all(torch.equal(x, y) for x, y in zip(a, b))
        assert a[2].size(1) < 20 or not bool((a[0][:, -1] == eot).all())  # some early stop was exercised


def test_inverse_cdf_draws_follow_the_probabilities():
    """sample_next's inverse-CDF draw: empirical frequencies of 40,000 draws from one row match the
    softmax (within 5 standard errors), a zero-probability (top-k filtered) token never appears."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5, -3.0]]).repeat(40000, 1)
    draws = sample_next(logits, Sampling(top_k=5), torch.rand(40000, generator=torch.Generator().manual_seed(0)))
    freq = torch.bincount(draws, minlength=6).double() / len(draws)
    p = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5, float("-inf")]).double().softmax(0)
    assert freq[5] == 0
    assert ((freq - p).abs() <= 5 * (p * (1 - p) / len(draws)).sqrt() + 1e-12).all(), (freq, p)
    u = torch.tensor([0.0, 0.999999])  # the ends of [0, 1): the first and the last allowed token
    assert sample_next(logits[:2], Sampling(top_k=5), u).tolist() == [0, 4]


@pytest.mark.parametrize("split", [1, 2])
def test_rows_of_a_batch_sampled_apart_equal_one_call(tiny_gpt, split):
    """Two calls, each on its share of the prompts with its columns of the uniforms one call draws
    (max_new_tokens x rows, before the first step), give exactly the rows one call over all prompts does:
    what several processes sampling their shares of one batch rely on (scale/distributed.sample_share)."""
    kw = dict(max_new_tokens=9, eot_id=3, num_samples=3, sampling=Sampling(top_p=0.9))
    u = torch.rand(9, len(PROMPTS) * 3, generator=torch.Generator().manual_seed(5))
    whole = generate(tiny_gpt, PROMPTS, u=u, **kw)
    cut = split * len(PROMPTS) // 3 or 1
    parts = [generate(tiny_gpt, PROMPTS[lo:hi], u=u[:, lo * 3:hi * 3], **kw) for lo, hi in ((0, cut), (cut, len(PROMPTS)))]
    T = whole[2].size(1)
    for (lo, hi), (idx, pad, mask) in zip(((0, cut), (cut, len(PROMPTS))), parts):
        n = mask.size(1)
        assert torch.equal(mask, whole[2][lo * 3:hi * 3, :n]) and not whole[2][lo * 3:hi * 3, n:].any()
        assert torch.equal(idx[:, -n:], whole[0][lo * 3:hi * 3, -T:][:, :n])


def test_uniforms_drawn_at_once_equal_a_draw_per_step(tiny_gpt):
    """The generator's numbers come in the same order whether drawn per step (one row of u at a time) or all
    before the first step, so a run's completions do not depend on how generate draws them."""
    kw = dict(max_new_tokens=7, eot_id=3, num_samples=2, sampling=Sampling(temperature=0.8))
    g = torch.Generator().manual_seed(9)
    per_step = torch.cat([torch.rand(1, len(PROMPTS) * 2, generator=g) for _ in range(7)])
    at_once = uniforms(7, len(PROMPTS) * 2, 9, "cpu")
    assert torch.equal(generate(tiny_gpt, PROMPTS, u=at_once, **kw)[0],
                       generate(tiny_gpt, PROMPTS, u=per_step, **kw)[0])


def test_uniforms_of_the_wrong_shape_are_refused(tiny_gpt):
    with pytest.raises(AssertionError, match="u must be"):
        generate(tiny_gpt, PROMPTS, 3, NEVER, num_samples=2, u=torch.rand(3, len(PROMPTS)))

@pytest.mark.parametrize("how", ["--start", "--question"])
def test_sample_py_refuses_a_prompt_that_leaves_no_room_in_one_line(tiny_setup, capsys, monkeypatch, how):
    """The prompt typed and max_new_tokens beyond the model's context (128 tokens): one line, exit 2,
    before any sampling (it was model.generate's refusal)."""
    import sample
    from data.prompts import encode_prompt
    from runs.loading import load_policy
    enc = load_policy(tiny_setup)[1]
    text = "Mia has 3 apples and 4 pears. " * 4
    P = len(enc.encode(text, allowed_special="all") if how == "--start" else encode_prompt(enc, text))
    monkeypatch.setattr(sample, "generate", None)  # not reached
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        cli_main(sample.main, [f"--ckpt={tiny_setup}", f"{how}={text}", f"--max_new_tokens={129 - P}"])
    said = f"prompt of {P} tokens + max_new_tokens={129 - P} exceeds the context of 128 tokens; shorten either"
    assert e.value.code == 2 and capsys.readouterr().err == f"error: {said}\n"
