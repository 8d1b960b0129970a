"""
Predicted peak memory of a train_grpo.py config on a model too big for this machine: a PREDICTION from
bench/memory.predicted_memory's analytic model, not a measurement.

    python -m bench.predict config/gsm8k_qwen15b.py [--prompt_len=200] [any train_grpo.py knob=value]
    python -m bench.predict --check       # the terms against a measured step on this CPU (a small model)

The model's shape: the config.json in the config's base_ckpt directory where it is there, else the published
config.json fields of the Qwen2.5 instruct models below (read by the same parser, pretrained/hfconfig.py).
Parameters are counted on the meta device (no memory is allocated). The config's knobs are checked
as train_grpo.py checks them (checks/grpo_knobs.validate; the prompt and max_new_tokens within the
context), so that a run train_grpo.py refuses gets no prediction. The terms:
  weights   every frozen base parameter in the run's dtype (bfloat16: 2 bytes, float32: 4; 'auto'
            as train_grpo.py resolves it on the config's device: scale/device.bf16_is_fast)
  lora      the LoRA factors in float32 with their gradients and AdamW's two moments: 16 bytes each
  step      the largest of the step's passes (predicted_memory): sampling (the KV cache of every row, GQA's
            fewer key/value heads counted), the reference pass and the policy pass with its backward, the two
            passes per micro-batch; with grad_checkpoint each block keeps only its input, and one block's
            insides live again while its backward runs.
prompt_len is the longest prompt in tokens (chat template, instruction and question): an assumption to state.
"""
# configurator first: a Ctrl-C during the slow imports below (torch) is one line, not a traceback
from configurator import UserError, check, cli_main, configure, quiet_start
quiet_start(__name__)
import os
import subprocess
import sys

import torch

from bench.memory import memory_variant, predicted_memory
from bench.scripts import GRPO_DEFAULTS
from lora import apply_lora, lora_parameters
from model import GPT, GPTConfig
from runs.checkpoint import load_checkpoint
from runs.loading import check_lora
from pretrained.hfconfig import hf_config_args, read_object
from checks.grpo_knobs import validate
from scale.device import bf16_is_fast, check_device_name, check_dtype

GB = 1e9
# the fields of huggingface.co/Qwen/<name>/config.json that set the shape (the others are defaults)
PUBLISHED = {
    "qwen2.5-0.5b-instruct": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                  num_attention_heads=14, num_key_value_heads=2, vocab_size=151936),
    "qwen2.5-1.5b-instruct": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                  num_attention_heads=12, num_key_value_heads=2, vocab_size=151936),
}
COMMON = dict(model_type="qwen2", max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
              tie_word_embeddings=True, hidden_act="silu", torch_dtype="bfloat16")


def model_shape(base):
    """GPTConfig arguments of the base: its directory's config.json, else a published shape by its name."""
    file = os.path.join(base, "config.json")
    if os.path.isfile(base):
        raise UserError(f"base_ckpt={base} is {what_file(base)}, not a Hugging Face model "
                        f"directory: bench.predict reads a model's config.json; give base_ckpt=DIR "
                        f"of a downloaded model (or a name of {', '.join(PUBLISHED)}), or measure "
                        f"this project's own models with python -m bench")
    if os.path.isfile(file):
        return hf_config_args(read_object(file), base), file
    name = os.path.basename(os.path.normpath(base)).lower()
    if base.endswith(".pt"):  # a train_base.py checkpoint (train_grpo.py trains it if missing)
        raise UserError(f"base_ckpt={base} names a train_base.py checkpoint of this project (none "
                        f"is there yet), not a Hugging Face model directory: bench.predict reads a "
                        f"model's config.json; give base_ckpt=DIR of a downloaded model (or a "
                        f"name of {', '.join(PUBLISHED)})")
    if name not in PUBLISHED:
        raise UserError(f"no {file}, and {name!r} is not one of the shapes known here ({', '.join(PUBLISHED)}): "
                        f"download the model first, or give base_ckpt of a known one")
    return hf_config_args({**COMMON, **PUBLISHED[name]}, base), f"the published config.json of {name}"


def what_file(path):
    """What a file given as base_ckpt is, in words (this project's checkpoints say what wrote
    them)."""
    try:
        ckpt = load_checkpoint(path)
    except (UserError, Exception):  # noqa: BLE001 (anything unreadable is "not a checkpoint")
        return "a file that is not a checkpoint"
    if "lora" in ckpt:
        return "a train_grpo.py checkpoint (an adapter, not a base)"
    return "a train_base.py checkpoint of this project" if "model_args" in ckpt else "a checkpoint"


def predicted_dtype(cfg):
    """(dtype, why): the dtype train_grpo.py would run in on cfg's device; 'auto' as scale/device
    resolves it, a CUDA device this machine lacks assumed to have bfloat16 (said in the output)."""
    check_device_name(cfg["device"])  # as train_grpo.py refuses them
    check_dtype(cfg["dtype"])
    if cfg["dtype"] != "auto":
        return cfg["dtype"], "as configured"
    if cfg["device"].startswith("cuda") and not torch.cuda.is_available():
        return "bfloat16", ("auto: a CUDA GPU with bfloat16 (Ampere or later) assumed; "
                            "--dtype=float32 otherwise")
    fast, why = bf16_is_fast(cfg["device"])
    return ("bfloat16" if fast else "float32"), f"auto: {why}"


def check_context(cfg, args, prompt_len):
    """A prompt of prompt_len tokens and max_new_tokens after it must fit the base's context, as
    checks/grpo_knobs.check_question_lengths requires of the longest question."""
    block = args["block_size"]
    if prompt_len >= block:
        raise UserError(f"--prompt_len={prompt_len} is the base's whole context {block} or more: "
                        f"no token could be generated; give the longest prompt (< {block})")
    check(cfg, "max_new_tokens", prompt_len + cfg["max_new_tokens"] <= block,
          f"the longest prompt, {prompt_len} tokens (--prompt_len), + max_new_tokens must fit the "
          f"base's context of {block}: give at most {block - prompt_len}")


def activation_units(C, inner):
    """Activations a block saves for backward per token, in units of n_embd elements (bf16), for the SwiGLU
    block (derived, not counted): the GPT-2 block's 11 units outside its MLP (bench/memory.py's 19 less the
    8 of its 4x GELU MLP), 3 more for RoPE's rotated q and k and GQA's keys and values repeated to every head,
    and 4 * inner / C for the MLP (gate, up, silu(gate) and their product)."""
    return 14 + 4 * inner / C


def predict(cfg, prompt_len):
    """(terms in bytes, the model's GPTConfig arguments, where the shape came from)."""
    args, source = model_shape(cfg["base_ckpt"])
    check_context(cfg, args, prompt_len)
    dtype, why = predicted_dtype(cfg)
    with torch.device("meta"):  # shapes only: no memory is allocated
        model = GPT(GPTConfig(**args))
        check_lora(model, cfg["lora_r"], cfg["lora_targets"])
        apply_lora(model, cfg["lora_r"], cfg["lora_alpha"], 0.0, cfg["lora_targets"])
    n_lora = sum(p.numel() for p in lora_parameters(model))
    n_base = sum(p.numel() for p in model.parameters()) - n_lora
    b = 2 if dtype == "bfloat16" else 4
    N, C = cfg["batch_size"] * cfg["group_size"], args["n_embd"]
    kv_dim = C // args["n_head"] * (args.get("n_kv_head") or args["n_head"])  # GQA: fewer heads
    swiglu = args.get("arch", "gpt2") != "gpt2"  # GPT-2's GELU block: predicted_memory's own count
    act_c = activation_units(C, args["n_inner"]) if swiglu else None
    step = predicted_memory(n_base, N, prompt_len, cfg["max_new_tokens"], args["vocab_size"], args["n_layer"], C, b,
                            False, group=cfg["group_size"], act_c=act_c, kv_dim=kv_dim,
                            micro=cfg["micro_batch_size"] or N,
                            grad_checkpoint=cfg["grad_checkpoint"])
    terms = dict(weights=n_base * b, lora=n_lora * 16, step=step["step"])
    passes = {k: step[k] for k in ("sampling", "reference", "policy_backward")}
    return dict(terms, total=sum(terms.values()), dtype=dtype, dtype_why=why, passes=passes,
                n_base=n_base, n_lora=n_lora), args, source


CHECK = dict(n_layer=8, n_head=4, n_embd=256, vocab=512, n_prompts=4, group=8, prompt_len=16, new_tokens=112,
             seed=0, device="cpu")  # activations, not logits, dominate: the terms this file adds are what shows


def check_child(micro, grad_checkpoint):
    """In a fresh process: one project step at CHECK's size, measured (peak RSS above the setup) and predicted."""
    s = {**CHECK, "micro": micro, "grad_checkpoint": grad_checkpoint}  # the warm-up step runs whole
    r = memory_variant("project", s)
    pred = predicted_memory(r["n_params"], s["n_prompts"] * s["group"], s["prompt_len"], s["new_tokens"], s["vocab"],
                            s["n_layer"], s["n_embd"], 4, False, group=s["group"], micro=micro,
                            grad_checkpoint=grad_checkpoint)
    print(f"CHECK micro-batch {micro:2d}, grad_checkpoint {str(grad_checkpoint):5}: measured "
          f"{(r['peak'] - r['before']) / 2 ** 20:5.0f} MiB, predicted {pred['step'] / 2 ** 20:5.0f} MiB", flush=True)


def check_terms():
    """The micro-batch and checkpointing terms against a measurement on this CPU (peak RSS of a fresh process,
    glibc mapping every block from 64 KiB so that freed tensors leave RSS; float32, 4 x 8 rows)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 16)}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    print(f"{CHECK['n_layer']} layers x {CHECK['n_embd']}, vocabulary {CHECK['vocab']}, {CHECK['n_prompts']} x "
          f"{CHECK['group']} rows of {CHECK['prompt_len']} + {CHECK['new_tokens']} tokens, float32, CPU")
    for micro, ckpt in ((32, False), (32, True), (8, False), (8, True)):
        subprocess.run([sys.executable, "-c", f"from bench import predict; predict.check_child({micro}, {ckpt})"],
                       cwd=root, env=env, check=True)


def main(argv):
    if argv == ["--check"]:
        return check_terms()
    if not argv or argv[0].startswith("--"):
        raise UserError("usage: python -m bench.predict CONFIG.py [--prompt_len=200] [--knob=value ...]")
    prompt_len = 200
    rest = []
    for a in argv:
        if a.startswith("--prompt_len="):
            v = a.split("=", 1)[1]
            if not v.isdecimal() or int(v) < 1:
                raise UserError(f"{a}: give the longest prompt as a whole number of tokens >= 1")
            prompt_len = int(v)
        else:
            rest.append(a)
    cfg = configure(GRPO_DEFAULTS, rest)
    # a base this file cannot read is named first (not as the wrong task's)
    model_shape(cfg["base_ckpt"])
    validate(cfg)  # what train_grpo.py refuses gets no prediction
    r, args, source = predict(cfg, prompt_len)
    print(f"PREDICTION (bench/memory.predicted_memory, not a measurement) for {rest[0]}: shape from {source}")
    print(f"  {args['n_layer']} layers x {args['n_embd']}, MLP {args['n_inner']}, {args['n_head']} heads "
          f"({args.get('n_kv_head') or args['n_head']} key/value), vocabulary "
          f"{args['vocab_size']}; {r['n_base'] / 1e9:.2f} B base parameters, "
          f"{r['n_lora'] / 1e6:.1f} M LoRA")
    print(f"  {cfg['batch_size']} x {cfg['group_size']} rows, prompt <= {prompt_len} + {cfg['max_new_tokens']} new tokens, "
          f"micro-batch {cfg['micro_batch_size'] or 'all'}, grad_checkpoint "
          f"{cfg['grad_checkpoint']}, dtype {r['dtype']} ({r['dtype_why']})")
    print("  " + ", ".join(f"{k} {v / GB:.2f} GB" for k, v in r["passes"].items()) + " (the step is the largest)")
    print(f"  weights {r['weights'] / GB:.2f} GB + LoRA and AdamW {r['lora'] / GB:.2f} GB + step {r['step'] / GB:.2f} GB"
          f" = peak {r['total'] / GB:.2f} GB")
    if cfg["tracin"]:
        print("  not counted: TracIn's captured layer inputs and output gradients (ghost.py), its validation pass")
    return r


if __name__ == "__main__":
    cli_main(main)
