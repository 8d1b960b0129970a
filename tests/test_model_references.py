# The Hugging Face surfaces against transformers where a default value hides a mistake: a merged GPT-2
# export read back by transformers (Conv1D weights transposed back), a non-default norm epsilon, RMSNorm's
# float32 statistics under bf16 input, and bf16_is_fast on CPUs that have AVX-512 without its bf16 part.
# Run: python -m pytest -q tests/test_model_references.py
import copy
import io

import pytest
import torch

from hf_dirs import make_dir, write_config
from lora import apply_lora, merge_lora
from model import RMSNorm
from pretrained.hf import from_pretrained

transformers = pytest.importorskip("transformers", reason="transformers is the test-only reference (.ci/run)")


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("gpt2"))
    make_dir(path, "gpt2")
    return path


def test_merged_gpt2_export_computes_in_transformers_what_the_adapter_does(gpt2_dir, tmp_path):
    """Every Conv1D layer (c_attn, attn.c_proj, c_fc, mlp.c_proj; the square c_proj too, where a missing
    transpose keeps the shape) adapted, merged, written and read back by transformers: the same logits."""
    from pretrained.hf import save_pretrained
    model = from_pretrained(gpt2_dir)
    apply_lora(model, r=4, alpha=8, targets=("c_attn", "c_proj", "c_fc"))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_" in n:
                p.normal_(0, 0.2, generator=torch.Generator().manual_seed(len(n)))  # B != 0: the adapter acts
    x = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        adapted = model(x, keep_last=12)[0]
        merged = merge_lora(copy.deepcopy(model))
        save_pretrained(merged, str(tmp_path / "merged"), gpt2_dir, torch.float32)
        theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged")).eval()(x).logits
        base = transformers.AutoModelForCausalLM.from_pretrained(gpt2_dir).eval()(x).logits
    assert rel(adapted, base) > 1e-2  # the adapter changed the function: a wrong merge cannot hide
    assert rel(theirs, adapted) <= 1e-5
    for name, w in merged.named_parameters():  # each Conv1D weight written as (in, out), as transformers holds it
        if name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged")).get_parameter(name)
            assert torch.equal(hf.t(), w), name


@pytest.mark.parametrize("family,key", [("gpt2", "layer_norm_epsilon"), ("qwen2", "rms_norm_eps"),
                                        ("llama", "rms_norm_eps")])
def test_a_non_default_norm_epsilon_is_the_one_used(tmp_path, family, key):
    """config.json's epsilon, set far from every default (1e-5, 1e-6), gives transformers' logits; and it
    matters for these weights (a model that ignored it would differ by more than the tolerance)."""
    path = str(tmp_path)
    make_dir(path, family)
    x = torch.randint(0, 300, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        default = transformers.AutoModelForCausalLM.from_pretrained(path).eval()(x).logits
        for eps in (0.3, 0.02, 1e-3):
            write_config(path, **{key: eps})
            theirs = transformers.AutoModelForCausalLM.from_pretrained(path).eval()(x).logits
            ours = from_pretrained(path)(x, keep_last=10)[0]
            assert from_pretrained(path).config.norm_eps == eps
            if eps >= 0.02:
                assert rel(theirs, default) > 1e-3, eps  # this epsilon changes the function
            assert rel(ours, theirs) <= 1e-5, eps


@pytest.mark.parametrize("scale", [1e-3, 1.0, 40.0])
def test_rms_norm_of_bf16_input_uses_float32_statistics(scale):
    """bf16 activations: the mean of squares and rsqrt in float32, the product cast back once, as
    transformers' LlamaRMSNorm does; against that formula written out and against transformers."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    g = torch.Generator().manual_seed(int(scale * 1000))
    n, eps = 96, 1e-6
    ours = RMSNorm(n, eps).to(torch.bfloat16)
    theirs = LlamaRMSNorm(n, eps).to(torch.bfloat16)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(n, generator=g))
        theirs.weight.copy_(ours.weight)
    x = (torch.randn(64, n, generator=g) * scale * (1 + 10 * torch.rand(64, 1, generator=g))).to(torch.bfloat16)
    h = x.float()
    want = ours.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(torch.bfloat16)
    with torch.no_grad():
        got = ours(x)
        assert got.dtype == torch.bfloat16
        assert torch.equal(got, want)
        assert torch.equal(got, theirs(x))


# --------------------------------------------------------------------------------- bf16 on a CPU
AVX512 = "fpu sse sse2 avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl"
CPUS = [  # (flags line, bf16 fast?): the bf16 instructions, not AVX-512 as such, decide
    (AVX512, False),
    (AVX512 + " avx512_vnni avx512_vbmi avx512_fp16 avx512ifma avx512_vp2intersect", False),
    (AVX512 + " amx_tile amx_int8", False),
    ("fpu sse sse2 avx avx2 fma", False),
    ("", False),
    (AVX512 + " avx512_vnni avx512_bf16", True),
    (AVX512 + " amx_tile amx_int8 amx_bf16", True),
    ("fpu sse avx2 avx512f avx512_bf16", True),
]


@pytest.mark.parametrize("flags,fast", CPUS)
@pytest.mark.parametrize("capability", ["AVX512", "AVX2", "DEFAULT"])
def test_bf16_is_fast_only_with_a_bf16_instruction_set(monkeypatch, flags, fast, capability):
    """/proc/cpuinfo as given, whatever torch's own CPU capability says (it reports AVX512 for any AVX-512 CPU)."""
    from scale import device
    cpuinfo = f"processor\t: 0\nmodel name\t: a CPU\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n"
    real_open = open
    monkeypatch.setattr(device, "open", lambda f, *a, **k: io.StringIO(cpuinfo) if f == "/proc/cpuinfo"
                        else real_open(f, *a, **k), raising=False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    ok, why = device.bf16_is_fast("cpu")
    assert ok is fast, why
    assert device.resolve_dtype("cpu", "auto") == ("bfloat16" if fast else "float32")
