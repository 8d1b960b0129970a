"""
What a run trained, in the formats other tools read (a run on a Hugging Face base directory):

    python -m pretrained.export --out_dir=out/qwen_grpo                 # out/qwen_grpo/peft_adapter: a peft adapter
    python -m pretrained.export --out_dir=out/qwen_grpo --merged=True   # and out/qwen_grpo/merged: W + s B A folded in

The adapter loads in peft on the base it was trained on, the merged directory in transformers and in
GPT.from_pretrained:
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(BASE), "out/qwen_grpo/peft_adapter")
    model = AutoModelForCausalLM.from_pretrained("out/qwen_grpo/merged")

It writes only new directories (or empty ones) and its own earlier exports (marked by grpo_export.json, which
names the checkpoint and iteration), each checked before the model is loaded; it holds the run's lock, so
an export during training is refused. --ckpt=RUN/ckpt_000100.pt exports that checkpoint into RUN.
"""
# configurator first: a Ctrl-C during the slow imports below (torch) is one line, not a traceback
from configurator import UserError, check, cli_main, configure
import os
from contextlib import nullcontext

from pretrained.hf import check_out, hf_dtype, save_peft_adapter, save_pretrained
from lora import LoRALinear, merge_lora
from model import load_checkpoint
from runs.base import resolve_base
from runs.rundir import run_lock
from runs.loading import load_policy

defaults = dict(
    out_dir="",          # the train_grpo.py run; '' = the directory of --ckpt, or else out/grpo
    ckpt="",             # '' = out_dir/ckpt.pt (the last step); or one of its ckpt_NNNNNN.pt
    adapter_dir="",      # '' = out_dir/peft_adapter
    merged=False,        # also write the merged model
    merged_dir="",       # '' = out_dir/merged
    base_ckpt="",        # the run's base where it is now, if it moved ('' = where the run found it)
)


def same_path(a, b):
    return os.path.realpath(a) == os.path.realpath(b)


def run_and_checkpoint(cfg):
    """(run directory, checkpoint path): a checkpoint lies in its run's directory, where the outputs go by
    default, so an --out_dir that is not the directory of --ckpt names another run: refused."""
    if cfg["ckpt"]:
        run = os.path.dirname(cfg["ckpt"]) or "."
        if cfg["out_dir"] and not same_path(run, cfg["out_dir"]):
            raise UserError(f"--ckpt={cfg['ckpt']} belongs to the run in {run}, not to --out_dir={cfg['out_dir']}: "
                            f"give --ckpt alone (the outputs go into {run}), and name other outputs with "
                            f"--adapter_dir / --merged_dir")
        return run, cfg["ckpt"]
    run = cfg["out_dir"] or "out/grpo"
    return run, os.path.join(run, "ckpt.pt")


def output_dirs(cfg, run):
    """(adapter_dir, merged_dir or None), both checked before anything is loaded or written: new, empty or
    an earlier export; two names for one directory (or one inside the other) refused."""
    check(cfg, "merged_dir", cfg["merged"] or not cfg["merged_dir"], "is written only with --merged=True")
    adapter_dir = cfg["adapter_dir"] or os.path.join(run, "peft_adapter")
    merged_dir = (cfg["merged_dir"] or os.path.join(run, "merged")) if cfg["merged"] else None
    if merged_dir:
        a, m = os.path.realpath(adapter_dir), os.path.realpath(merged_dir)
        if a == m or m.startswith(a + os.sep) or a.startswith(m + os.sep):
            raise UserError(f"--adapter_dir={adapter_dir} and --merged_dir={merged_dir} are the same directory or "
                            f"one holds the other: give two separate directories")
    replaced = [d for key, d in (("adapter_dir", adapter_dir), ("merged_dir", merged_dir))
                if d and check_out(d, key)]
    return adapter_dir, merged_dir, replaced


def main(argv):
    cfg = configure(defaults, argv)
    run, path = run_and_checkpoint(cfg)
    adapter_dir, merged_dir, replaced = output_dirs(cfg, run)
    # the run's lock: a training run in this directory is refused (its checkpoint is still moving); a run
    # directory this user cannot write to (another user's) is read without it
    can_lock = os.path.isdir(run) and os.access(run, os.W_OK)
    with run_lock(run, busy="wait for the run to end (export reads its checkpoint)") if can_lock else nullcontext():
        export(cfg, path, adapter_dir, merged_dir, replaced)


def export(cfg, path, adapter_dir, merged_dir, replaced):
    ckpt = load_checkpoint(path)
    if "lora" not in ckpt or "base_ckpt" not in ckpt:
        raise UserError(f"{path} is not a train_grpo.py checkpoint (no LoRA adapter): give the out_dir of a GRPO run")
    base, run_cfg = resolve_base(ckpt, path, cfg["base_ckpt"]), ckpt["config"]  # as sample.py finds it
    if not os.path.isdir(base):
        raise UserError(f"the run's base {base} is a train_base.py checkpoint, which peft and transformers cannot "
                        f"read: export needs a run on a Hugging Face model directory (train_grpo.py --base_ckpt=DIR)")
    source = {"ckpt": os.path.abspath(path), "iter": ckpt.get("iter_num"), "base": os.path.abspath(base)}
    said = f"iter {source['iter']} of {path}"
    model, _, _ = load_policy(path, base_ckpt=base)  # base + adapter, checked against the base's identity
    again = lambda d: " (replacing an earlier export)" if d in replaced else ""  # noqa: E731
    save_peft_adapter(model, adapter_dir, base, run_cfg["lora_r"], run_cfg["lora_alpha"], source)
    n = sum(isinstance(m, LoRALinear) for m in model.modules())
    print(f"wrote {adapter_dir}{again(adapter_dir)}: peft LoRA adapter of {said} (r={run_cfg['lora_r']}, "
          f"{n} layers, on {base})")
    if merged_dir:
        save_pretrained(merge_lora(model), merged_dir, base, hf_dtype(base), source)
        print(f"wrote {merged_dir}{again(merged_dir)}: the merged model of {said} ({hf_dtype(base)})")


if __name__ == "__main__":
    cli_main(main)
