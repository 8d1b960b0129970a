"""
Hugging Face model directories, in and out, with no transformers import:
  - config.json -> the GPTConfig switches of this project's GPT (gpt2, qwen2, llama families),
  - one table from module names here to a checkpoint's tensor names (HF_RENAME),
  - the safetensors file or shards holding the weights,
  - out: a run's adapter as a peft adapter directory, the merged model as a model directory.
from_pretrained (below) reads with these.
"""
import json
import os
import re
import shutil
from contextlib import contextmanager

import torch
import torch.nn as nn

from configurator import UserError
from model import GPT, GPTConfig
from fileio import check_output_dir, pid_alive
from lora import lora_modules
from pretrained.hfconfig import config_dtype, hf_config_args, read_object


# module and tensor names here -> a Hugging Face checkpoint's, replaced in this order (GPT-2: the same)
HF_RENAME = {"gpt2": (), "llama": (
    ("transformer.wte", "model.embed_tokens"), ("transformer.ln_f", "model.norm"),
    ("transformer.h.", "model.layers."), (".ln_1", ".input_layernorm"), (".ln_2", ".post_attention_layernorm"),
    (".attn.", ".self_attn."))}


def hf_name(name, arch):
    for ours, theirs in HF_RENAME[arch]:
        name = name.replace(ours, theirs)
    return name


def read_hf_config(path):
    file = os.path.join(path, "config.json")
    if not os.path.isfile(file):
        if os.path.isfile(os.path.join(path, "ckpt.pt")):  # a run's directory, not a model's
            raise UserError(f"{path} is a run directory, not a Hugging Face model directory: give its checkpoint, "
                            f"{os.path.join(path, 'ckpt.pt')}")
        raise UserError(f"{path} is not a Hugging Face model directory (no config.json)" if os.path.isdir(path)
                        else f"model directory not found: {path}")
    return read_object(file, "model config")


def hf_weight_files(path):
    """{file: its tensor names, or None for all of them}: one model.safetensors or the index's shards."""
    single, index = os.path.join(path, "model.safetensors"), os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(single):
        return {single: None}
    if not os.path.isfile(index):
        found = [f for f in os.listdir(path) if f.endswith((".bin", ".pt", ".pth", ".h5", ".msgpack"))]
        raise UserError(f"{path} has no model.safetensors nor model.safetensors.index.json"
                        + (f" (found {found[0]}: only safetensors weights are read)" if found else ""))
    weight_map = read_object(index, "safetensors index").get("weight_map")
    try:
        files = {}
        for key, name in weight_map.items():
            if not isinstance(name, str) or os.path.basename(name) != name:  # a file of this directory only
                raise ValueError(f"{key} is stored in {name!r}, not a file name")
            files.setdefault(os.path.join(path, name), []).append(key)
    except (ValueError, TypeError, AttributeError) as e:
        raise UserError(f"{index} is not a safetensors index ({type(e).__name__}: {e})") from None
    for file in files:
        if not os.path.isfile(file):
            raise UserError(f"{index} names {os.path.basename(file)}, which is missing from {path}")
    return files


@contextmanager
def open_safetensors(file):
    """safetensors.safe_open (memory-mapped), a damaged or cut file being a one-line error naming it."""
    from safetensors import safe_open  # only needed here: the tiny GPT runs without it
    try:
        with safe_open(file, framework="pt") as f:
            yield f
    except UserError:
        raise
    except Exception as e:  # SafetensorError, OSError: a cut download, another format
        why = (str(e).splitlines() or [""])[0][:120]
        raise UserError(f"{file} is not a readable safetensors file ({type(e).__name__}: {why}); "
                        f"download it again") from None


def hf_layer_count(path):
    """The layers the weight files hold (highest layer index in their tensor names + 1), from the files'
    headers alone: a config.json's layer count is checked against it before the model is built (a count of
    10^9 would otherwise build modules for hours before any tensor is read)."""
    n = 0
    for file, keys in hf_weight_files(path).items():
        if keys is None:
            with open_safetensors(file) as f:
                keys = list(f.keys())
        for key in keys:
            if m := re.search(r"(?:^|\.)(?:h|layers)\.(\d+)\.", key):
                n = max(n, int(m[1]) + 1)
    return n


def hf_tensors(path):
    """(name, tensor) of every tensor of the directory's weight files, as stored (memory-mapped)."""
    for file, keys in hf_weight_files(path).items():
        with open_safetensors(file) as f:
            for key in keys if keys is not None else f.keys():
                yield key, f.get_tensor(key)


def read_hf_weights(path, arch, shapes, dtype):
    """{name here: tensor in dtype} for every name of `shapes` (name -> expected shape), read one
    tensor at a time from memory-mapped safetensors files: a model never needs twice its size."""
    names, sd = {hf_name(k, arch): k for k in shapes}, {}  # checkpoint's name -> ours
    for file, keys in hf_weight_files(path).items():
        with open_safetensors(file) as f:
            for key in keys if keys is not None else f.keys():
                theirs = key if arch != "gpt2" or key.startswith(("transformer.", "lm_head.")) \
                    else "transformer." + key  # GPT-2 files exist with and without the prefix
                if theirs not in names:
                    if re.fullmatch(r".*\.attn\.(masked_)?bias|.*rotary_emb\.inv_freq|lm_head\.weight", theirs):
                        continue  # buffers older files carry; a tied head's copy of wte
                    raise UserError(f"{file}: unexpected tensor {key} for a {arch} model of this config.json")
                t = f.get_tensor(key)
                if not t.dtype.is_floating_point:  # quantized or damaged: casting would give other numbers
                    raise UserError(f"{file}: tensor {key} is stored as {str(t.dtype).removeprefix('torch.')}; "
                                    f"only float weights are read (quantized models are not supported)")
                if arch == "gpt2" and re.search(r"\.(c_attn|c_proj|c_fc)\.weight$", theirs):
                    t = t.t()  # GPT-2's Conv1D stores (in, out); nn.Linear holds (out, in)
                ours = names.pop(theirs)
                if t.shape != shapes[ours]:
                    raise UserError(f"{file}: tensor {key} has shape {tuple(t.shape)}, config.json implies "
                                    f"{tuple(shapes[ours])}")
                sd[ours] = t.to(dtype).contiguous()
    if names:
        raise UserError(f"{path}: missing tensor {sorted(names)[0]}"
                        + (f" and {len(names) - 1} more" if len(names) > 1 else ""))
    return sd


def from_pretrained(path, dtype=torch.float32, **overrides):
    """nanoGPT's GPT.from_pretrained: a GPT-2, Qwen2 or Llama-family model from a local
    Hugging Face directory (config.json + model.safetensors, or shards named in
    model.safetensors.index.json), its weights kept in `dtype`. overrides: GPTConfig fields
    the run sets (grad_checkpoint, dropout). Nothing is downloaded: fetch the directory first (README)."""
    config = GPTConfig(**{**hf_config_args(read_hf_config(path), path), **overrides})
    held = hf_layer_count(path)
    # checked before building n_layer blocks (fewer: an unexpected tensor, below)
    if config.n_layer > held:
        key = "n_layer" if config.arch == "gpt2" else "num_hidden_layers"
        raise UserError(f"{path}/config.json: {key} = {config.n_layer}, but the weights hold "
                        f"{held} layers: config.json and the weights do not belong together")
    with torch.device("meta"):  # no memory yet: each tensor comes once, straight from the file
        model = GPT(config)
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    if config.tie_head:  # the head is wte's weight (a file may still carry a copy: skipped)
        del shapes["lm_head.weight"]
    sd = read_hf_weights(path, config.arch, shapes, dtype)
    if config.tie_head:
        sd["lm_head.weight"] = sd["transformer.wte.weight"]
    model.load_weights(sd)  # the loaded tensors become the parameters: no copy
    return model.eval()


# ---------------------------------------------------------------------------------------------
# out: what other tools read

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "generation_config.json", "chat_template.jinja")


EXPORT_MARK = "grpo_export.json"  # what export wrote, from which checkpoint: the mark that it may replace it
WRITTEN_BY = "pretrained.export"  # export.py's signature in that mark, as every export has written it


EXPORT_FILES = {EXPORT_MARK, "adapter_config.json", "adapter_model.safetensors", "config.json",
                "model.safetensors", *TOKENIZER_FILES}  # every name an export writes


def is_export(path):
    """Whether the directory at path is one this module wrote (it holds EXPORT_MARK) and nothing else was
    put there since (a file of someone else's in it would be lost with it)."""
    try:
        with open(os.path.join(path, EXPORT_MARK)) as f:
            mark = json.load(f)
        ours = mark.get("written_by") == WRITTEN_BY
        return ours and set(os.listdir(path)) <= EXPORT_FILES
    except (OSError, ValueError, AttributeError):
        return False


def remove_stale_partials(out):
    """Remove what an export into `out` killed outright (SIGKILL, a power cut) left beside it: its
    .<name>.<PID>.*.partial directory, model-sized; an earlier export it had moved aside
    (.partial.old) goes back to `out` if nothing is there. Only a dead process's: a live one may
    still be writing."""
    parent, name = os.path.split(os.path.abspath(out))
    pattern = re.compile(rf"\.{re.escape(name)}\.(\d+)\.[^.]+\.partial(\.old)?")
    entries = os.listdir(parent) if os.path.isdir(parent) else []
    for entry in sorted(entries, key=lambda e: e.endswith(".old")):
        m = pattern.fullmatch(entry)
        if not m or int(m.group(1)) == os.getpid() or pid_alive(int(m.group(1))):
            continue
        stale = os.path.join(parent, entry)
        if m.group(2) and not os.path.lexists(out):
            os.rename(stale, out)
            print(f"put back {out}: the earlier export that process {m.group(1)} (not running) had "
                  "moved aside")
        else:
            shutil.rmtree(stale, ignore_errors=True)
            print(f"removed {stale}: a partial export left by process {m.group(1)}, which is not "
                  "running")


def new_directory(out):
    """A temporary directory of a fresh name beside `out` (never a path someone else may use, such as
    out + '.tmp'), named with this process's PID; finish_directory moves it to `out` once complete,
    so an interrupted export leaves no half directory, and one killed outright leaves one that the
    next export removes (remove_stale_partials). Nothing but an earlier export (or an empty
    directory) is replaced."""
    import tempfile
    remove_stale_partials(out)
    check_output_dir(out, "out", is_export, EXPORT_FILES)  # new, empty or an earlier export
    parent, name = os.path.split(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix=f".{name}.{os.getpid()}.", suffix=".partial", dir=parent)


def finish_directory(tmp, out, source):
    """Mark tmp as an export (source: where it came from), then put it at `out`: an earlier export
    there is moved aside first and removed only once the new one is in place."""
    with open(os.path.join(tmp, EXPORT_MARK), "w") as f:
        json.dump({"written_by": WRITTEN_BY, **(source or {})}, f, indent=1)
    old = None
    try:
        if check_output_dir(out, "out", is_export, EXPORT_FILES):  # again: changed while we wrote?
            old = tmp + ".old"
            os.rename(out, old)
        os.rename(tmp, out)  # onto an empty directory or none (a filled one raises: never overwritten)
    except BaseException:
        if old and not os.path.exists(out):
            os.rename(old, out)  # the earlier export back where it was
        shutil.rmtree(tmp, ignore_errors=True)  # ours: a fresh name made by new_directory
        raise
    if old:
        shutil.rmtree(old)


def save_peft_adapter(model, out, base_path, r, alpha, source=None):
    """The adapter as peft writes one (adapter_config.json + adapter_model.safetensors), so that
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_path), out) computes what
    this project's base + LoRA computes: peft's lora_A / lora_B hold the same (r, in) / (out, r)
    matrices and scale by lora_alpha / r, as lora.LoRALinear does."""
    from safetensors.torch import save_file
    arch = model.config.arch
    theirs = {hf_name(n, arch): m for n, m in lora_modules(model).items()}
    leaves = sorted({n.rsplit(".", 1)[-1] for n in theirs})
    same_leaf = {hf_name(n, arch) for n, m in model.named_modules() if n.rsplit(".", 1)[-1] in leaves
                 and (hasattr(m, "lora_A") or isinstance(m, nn.Linear)) and ".lora_" not in n}
    tensors = {f"base_model.model.{n}.{ab}.weight": getattr(m, ab).weight.detach().float().cpu().contiguous()
               for n, m in theirs.items() for ab in ("lora_A", "lora_B")}  # adapters stay float32
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": os.path.abspath(base_path),
              "r": r, "lora_alpha": alpha, "lora_dropout": 0.0, "bias": "none", "use_rslora": False,
              "use_dora": False, "fan_in_fan_out": arch == "gpt2",  # GPT-2's Conv1D: (in, out) weights
              # the layer names, or where only some layers of a name were adapted, a regex naming each one
              "target_modules": leaves if same_leaf == set(theirs) else "|".join(map(re.escape, sorted(theirs))),
              "inference_mode": True, "init_lora_weights": True, "modules_to_save": None}
    tmp = new_directory(out)
    try:
        save_file(tensors, os.path.join(tmp, "adapter_model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(tmp, "adapter_config.json"), "w") as f:
            json.dump(config, f, indent=2)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finish_directory(tmp, out, source)


def save_pretrained(model, out, base_path, dtype, source=None):
    """A merged model (no LoRA layers left) as a Hugging Face directory in `dtype`: the base's
    config.json, the weights under the checkpoint's names (GPT-2's Conv1D transposed back, a tied
    head written once), and the base's tokenizer files. from_pretrained and transformers read it."""
    from safetensors.torch import save_file
    arch, tied = model.config.arch, model.config.tie_head
    tensors = {}
    for k, v in model.state_dict().items():
        if tied and k == "lm_head.weight":
            continue
        if arch == "gpt2" and re.search(r"\.(c_attn|c_proj|c_fc)\.weight$", k):
            v = v.t()
        tensors[hf_name(k, arch)] = v.detach().to(dtype).cpu().contiguous()
    config = read_hf_config(base_path)
    config.update(dtype=str(dtype).removeprefix("torch."), torch_dtype=str(dtype).removeprefix("torch."))
    tmp = new_directory(out)
    try:
        save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        for name in TOKENIZER_FILES:
            if os.path.isfile(os.path.join(base_path, name)):
                shutil.copyfile(os.path.join(base_path, name), os.path.join(tmp, name))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finish_directory(tmp, out, source)


def hf_dtype(path):
    """The dtype a directory's weights are stored in (config.json's dtype / torch_dtype), float32 if unsaid."""
    return config_dtype(read_hf_config(path), path)
