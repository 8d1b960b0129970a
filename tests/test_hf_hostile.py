"""Hostile Hugging Face directories: every config.json field the loader reads, given each wrong type or
out-of-range value; JSON files nested past Python's recursion limit; integer weights and dtypes; a
tokenizer with ids that are not integers, merges that are not pairs, split patterns that do not compile,
drop text or backtrack without bound. Each must be one line naming the file, the key and the value.
Accepted edge values (an integer epsilon, an integer theta) are checked against transformers' logits.
Run: python -m pytest -q tests/test_hf_hostile.py"""
import json
import math
import os
import shutil

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is the test-only reference (installed by .ci/run)")
pytest.importorskip("tokenizers", reason="tokenizers trains the test tokenizers (installed by .ci/run)")
from safetensors.torch import load_file, save_file  # noqa: E402

from configurator import UserError  # noqa: E402
from hf_dirs import make_dir, write_config  # noqa: E402

from pretrained.hf import from_pretrained  # noqa: E402
from pretrained import tokenizer as tk  # noqa: E402
from pretrained.hf import hf_dtype  # noqa: E402


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    out = {}
    for family in ("gpt2", "llama"):
        path = str(tmp_path_factory.mktemp(family))
        make_dir(path, family, tied=False) if family == "llama" else make_dir(path, family)
        out[family] = path
    return out


def copy_of(src, dst):
    shutil.copytree(src, dst)
    return str(dst)


def one_line_error(call, *needles):
    with pytest.raises(UserError) as e:
        call()
    msg = str(e.value)
    assert "\n" not in msg, msg
    for n in needles:
        assert n in msg, (n, msg)
    return msg


# the fields each family's loader reads, and values of a wrong type or range for each kind of field
NOT_INT = ["4", 4.0, True, [4], {"n": 4}]
NOT_POSITIVE_INT = [0, -1, -64]
NOT_FLOAT = ["1e-6", True, [1e-6], {"v": 1}, None, 0, -1e-6, float("nan"), float("inf"), float("-inf")]
NOT_BOOL = ["false", "true", "False", 0, 1, None, [], {}]
NOT_DICT = ["default", 1, [], True, [{"rope_type": "default"}]]
FIELDS = {
    "llama": dict(
        required_int=["hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size",
                      "max_position_embeddings"],
        optional_int=["num_key_value_heads", "head_dim"],
        float=["rms_norm_eps", "rope_theta"],
        bool=["tie_word_embeddings", "use_sliding_window", "attention_bias", "mlp_bias"],
        str={"hidden_act": ["gelu", "SILU", 1, None, ["silu"]], "model_type": ["mistral", 1, None, ["llama"]]},
        dict=["rope_parameters", "rope_scaling"]),
    "gpt2": dict(
        required_int=["n_embd", "n_head", "n_layer", "n_positions", "vocab_size"],
        optional_int=["n_inner"],
        float=["layer_norm_epsilon"],
        bool=["tie_word_embeddings", "scale_attn_weights", "reorder_and_upcast_attn",
              "scale_attn_by_inverse_layer_idx", "add_cross_attention"],
        str={"activation_function": ["relu", "GELU", 1, None, ["gelu"]], "model_type": ["GPT2", 2, None]},
        dict=[]),
}


def cases():
    for family, f in FIELDS.items():
        for key in f["required_int"]:
            yield from ((family, key, v) for v in NOT_INT + NOT_POSITIVE_INT + [None])
        for key in f["optional_int"]:
            yield from ((family, key, v) for v in NOT_INT + NOT_POSITIVE_INT)
        for key in f["float"]:
            yield from ((family, key, v) for v in NOT_FLOAT)
        for key in f["bool"]:
            yield from ((family, key, v) for v in NOT_BOOL)
        for key, bad in f["str"].items():
            yield from ((family, key, v) for v in bad)
        for key in f["dict"]:
            yield from ((family, key, v) for v in NOT_DICT)
        for key in ("dtype", "torch_dtype"):  # integer dtypes would be read as plain (truncated) numbers
            yield from ((family, key, v) for v in ("int8", "uint8", "int32", "bool", "float8", 8, ["float32"]))


@pytest.mark.parametrize("family,key,value", list(cases()), ids=lambda v: repr(v)[:20])
def test_every_config_field_of_a_wrong_type_or_range_is_one_line_naming_it(dirs, tmp_path, family, key, value):
    d = copy_of(dirs[family], tmp_path / "d")
    config = json.load(open(f"{d}/config.json"))
    config[key] = value
    with open(f"{d}/config.json", "w") as f:
        json.dump(config, f)  # NaN / Infinity as Python's json writes them (and reads them back)
    one_line_error(lambda: from_pretrained(d), f"{d}/config.json", key, repr(value))


@pytest.mark.parametrize("changes,key", [
    (dict(num_attention_heads=3), "num_attention_heads"),      # 64 is not a multiple of 3
    (dict(num_attention_heads=64), "num_attention_heads"),     # head size 1: RoPE needs pairs
    (dict(num_key_value_heads=3), "num_key_value_heads"),      # 4 query heads cannot share 3
    (dict(head_dim=32), "head_dim"),
    (dict(layer_types=["sliding_attention", "full_attention"]), "sliding"),
    (dict(layer_types="full_attention"), "layer_types"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": "1e4"}), "rope_theta"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": -5.0}), "rope_theta"),
    (dict(quantization_config={"quant_method": "gptq", "bits": 4}), "quantization_config"),
])
def test_inconsistent_llama_configs_are_refused_by_name(dirs, tmp_path, changes, key):
    d = copy_of(dirs["llama"], tmp_path / "d")
    write_config(d, **changes)
    one_line_error(lambda: from_pretrained(d), key)


@pytest.mark.parametrize("changes,key", [(dict(n_head=3), "n_head"), (dict(n_head=128), "n_head")])
def test_inconsistent_gpt2_configs_are_refused_by_name(dirs, tmp_path, changes, key):
    d = copy_of(dirs["gpt2"], tmp_path / "d")
    write_config(d, **changes)
    one_line_error(lambda: from_pretrained(d), key)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("n", [3, 10 ** 9])
def test_a_layer_count_the_weights_do_not_hold_is_refused_before_building(dirs, tmp_path, family, n):
    """The files hold 2 layers; 10^9 would build modules for hours if the count were trusted first."""
    import time
    d = copy_of(dirs[family], tmp_path / "d")
    key = "n_layer" if family == "gpt2" else "num_hidden_layers"
    write_config(d, **{key: n})
    t = time.time()
    one_line_error(lambda: from_pretrained(d), f"{key} = {n}, but the weights hold 2 layers")
    assert time.time() - t < 30
    write_config(d, **{key: 1})  # fewer: the first tensor of layer 1 is named
    one_line_error(lambda: from_pretrained(d), "unexpected tensor", ".1.")


def test_accepted_edge_values_compute_what_transformers_computes(dirs, tmp_path):
    """An integer theta (JSON has one number type), a large epsilon and a float32 dtype load, and the model is the
    one transformers reads from the same file; the untied head stays untied."""
    from transformers import AutoModelForCausalLM
    d = copy_of(dirs["llama"], tmp_path / "d")
    write_config(d, rope_parameters={"rope_type": "default", "rope_theta": 50000}, rms_norm_eps=1e-2, torch_dtype="float32", dtype=None, tie_word_embeddings=False)
    ours, theirs = from_pretrained(d), AutoModelForCausalLM.from_pretrained(d).eval()
    assert ours.config.rope_theta == 50000.0 and ours.config.norm_eps == 1e-2 and not ours.config.tie_head
    x = torch.randint(0, 300, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref, got = theirs(x).logits, ours(x, keep_last=9)[0]
    assert ((got - ref).abs().max() / ref.abs().max()) < 1e-5
    assert hf_dtype(d) == torch.float32


NESTINGS = {"list": lambda n: "[" * n + "]" * n, "object": lambda n: '{"a": ' * n + "1" + "}" * n}


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"])
@pytest.mark.parametrize("nesting", NESTINGS)
def test_deeply_nested_json_is_one_line(dirs, tmp_path, name, nesting):
    d = copy_of(dirs["llama"], tmp_path / "d")
    with open(f"{d}/{name}", "w") as f:
        f.write(NESTINGS[nesting](200_000))
    load = (lambda: from_pretrained(d)) if name == "config.json" else (lambda: tk.load_hf_tokenizer(d))
    one_line_error(load, f"{d}/{name}", "nested too deeply")


def test_deeply_nested_safetensors_index_is_one_line(dirs, tmp_path):
    d = copy_of(dirs["llama"], tmp_path / "d")
    os.remove(f"{d}/model.safetensors")
    with open(f"{d}/model.safetensors.index.json", "w") as f:
        f.write(NESTINGS["object"](200_000))
    one_line_error(lambda: from_pretrained(d), "model.safetensors.index.json", "nested too deeply")


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_weight_of_an_integer_dtype_is_named_not_cast(dirs, tmp_path, dtype, family):
    d = copy_of(dirs[family], tmp_path / "d")
    sd = load_file(f"{d}/model.safetensors")
    name = sorted(sd)[len(sd) // 2]
    sd[name] = (sd[name] * 100).to(dtype)
    save_file(sd, f"{d}/model.safetensors")
    one_line_error(lambda: from_pretrained(d), name, str(dtype).removeprefix("torch."))


# ----------------------------------------------------------------------------------------------
# the tokenizer

def edit_tokenizer(src, dst, edit):
    d = copy_of(src, dst)
    tok = json.load(open(f"{d}/tokenizer.json"))
    edit(tok)
    with open(f"{d}/tokenizer.json", "w") as f:
        json.dump(tok, f)
    return d


def some_token(tok):
    return sorted(tok["model"]["vocab"])[300]


BAD_IDS = ["7", 7.0, 7.5, True, None, -1, 2 ** 40, [7]]


@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
@pytest.mark.parametrize("where", ["vocab", "added_token"])
def test_a_token_id_that_is_not_an_integer_is_refused_by_name(dirs, tmp_path, bad, where):
    def edit(tok):
        if where == "vocab":
            tok["model"]["vocab"][some_token(tok)] = bad
        else:
            tok["added_tokens"][0]["id"] = bad
    d = edit_tokenizer(dirs["llama"], tmp_path / "d", edit)
    name = some_token(json.load(open(f"{dirs['llama']}/tokenizer.json"))) if where == "vocab" else "<|endoftext|>"
    one_line_error(lambda: tk.load_hf_tokenizer(d), "tokenizer.json", repr(name), repr(bad)[:40])


@pytest.mark.parametrize("bad", ["Ġ", "a b c", 5, None, ["a"], ["a", 1], {"a": "b"}], ids=repr)
def test_a_merge_that_is_not_two_tokens_is_refused_by_name(dirs, tmp_path, bad):
    d = edit_tokenizer(dirs["llama"], tmp_path / "d", lambda tok: tok["model"]["merges"].__setitem__(3, bad))
    one_line_error(lambda: tk.load_hf_tokenizer(d), "tokenizer.json", "merge 3")


SPLIT_PATTERNS = {
    "does not compile": ["(", "[a-", r"\p{NotAClass}+", ")", "a**", "(?<n", "[z-a]", "\\"],
    "backtracking": [r"(a|aa)+(?=c)|[\s\S]", r"(?:!|!!)+(?!x)(?=c)|[\s\S]", r"(?:7|77)+(?=q)|[\s\S]"],
    "drops or changes": [r"\p{L}+", r"[^\s]+", r"\p{L}+|\p{N}|\s+", r"(?!\s)[\s\S]"],
    "not a regular expression": [5, None, ["\\s+"]],
}


@pytest.mark.parametrize("why,pattern", [(w, p) for w, ps in SPLIT_PATTERNS.items() for p in ps], ids=repr)
def test_a_split_pattern_that_fails_is_one_line(dirs, tmp_path, why, pattern):
    def edit(tok):
        tok["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = pattern
    d = edit_tokenizer(dirs["llama"], tmp_path / "d", edit)
    one_line_error(lambda: tk.load_hf_tokenizer(d), "tokenizer.json", "split pattern", why)


def test_a_panic_on_other_text_is_one_line_not_a_traceback(dirs, tmp_path, monkeypatch):
    """The load-time probe tries fixed strings only: a text that still trips the backtracking limit later
    is a UserError from encode, never pyo3's PanicException (a BaseException) escaping the scripts."""
    d = edit_tokenizer(dirs["llama"], tmp_path / "d", lambda tok: tok["pre_tokenizer"]["pretokenizers"][0][
        "pattern"].__setitem__("Regex", r"(?:q|qq)+(?=z)|[\s\S]"))
    monkeypatch.setattr(tk, "PROBE_TEXTS", ["Mia has 3 apples."])
    enc = tk.load_hf_tokenizer(d)
    assert enc.decode(enc.encode("Mia has 3 apples.")) == "Mia has 3 apples."
    for encode in (enc.encode, enc.encode_ordinary):
        one_line_error(lambda: encode("q" * 3000), "backtracking limit")
