"""
What a run trained, in the formats other tools read (a run on a Hugging Face base directory):

    python -m pretrained.export --out_dir=out/qwen_grpo                 # out/qwen_grpo/peft_adapter: a peft adapter
    python -m pretrained.export --out_dir=out/qwen_grpo --merged=True   # and out/qwen_grpo/merged: W + s B A folded in

The adapter loads in peft on the base it was trained on, the merged directory in transformers and in
GPT.from_pretrained:
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(BASE), "out/qwen_grpo/peft_adapter")
    model = AutoModelForCausalLM.from_pretrained("out/qwen_grpo/merged")
"""
# configurator first: a Ctrl-C during the slow imports below (torch) is one line, not a traceback
from configurator import UserError, check, cli_main, configure
import os

from pretrained.hf import hf_dtype, save_peft_adapter, save_pretrained
from lora import LoRALinear, merge_lora
from model import load_checkpoint, resolve_base
from sample import load_policy

defaults = dict(
    out_dir="out/grpo",  # the train_grpo.py run
    ckpt="",             # '' = out_dir/ckpt.pt (the last step); or one of its ckpt_NNNNNN.pt
    adapter_dir="",      # '' = out_dir/peft_adapter
    merged=False,        # also write the merged model
    merged_dir="",       # '' = out_dir/merged
    base_ckpt="",        # the run's base where it is now, if it moved ('' = where the run found it)
)


def main(argv):
    cfg = configure(defaults, argv)
    check(cfg, "out_dir", cfg["out_dir"] != "", "give the out_dir of a train_grpo.py run")
    check(cfg, "merged_dir", cfg["merged"] or not cfg["merged_dir"], "is written only with --merged=True")
    path = cfg["ckpt"] or os.path.join(cfg["out_dir"], "ckpt.pt")
    ckpt = load_checkpoint(path)
    if "lora" not in ckpt or "base_ckpt" not in ckpt:
        raise UserError(f"{path} is not a train_grpo.py checkpoint (no LoRA adapter): give the out_dir of a GRPO run")
    base, run_cfg = resolve_base(ckpt, path, cfg["base_ckpt"]), ckpt["config"]  # as sample.py finds it
    if not os.path.isdir(base):
        raise UserError(f"the run's base {base} is a train_base.py checkpoint, which peft and transformers cannot "
                        f"read: export needs a run on a Hugging Face model directory (train_grpo.py --base_ckpt=DIR)")
    adapter_dir = cfg["adapter_dir"] or os.path.join(cfg["out_dir"], "peft_adapter")
    merged_dir = (cfg["merged_dir"] or os.path.join(cfg["out_dir"], "merged")) if cfg["merged"] else None
    for d in filter(None, (adapter_dir, merged_dir)):  # both refused before either is written
        if os.path.exists(d):
            raise UserError(f"{d} exists: remove it, or give another --adapter_dir / --merged_dir")
    model, _, _ = load_policy(path, base_ckpt=base)  # base + adapter, checked against the base's identity
    save_peft_adapter(model, adapter_dir, base, run_cfg["lora_r"], run_cfg["lora_alpha"])
    n = sum(isinstance(m, LoRALinear) for m in model.modules())
    print(f"wrote {adapter_dir} (peft LoRA adapter, r={run_cfg['lora_r']}, {n} layers, on {base})")
    if merged_dir:
        save_pretrained(merge_lora(model), merged_dir, base, hf_dtype(base))
        print(f"wrote {merged_dir} (the merged model, {hf_dtype(base)})")


if __name__ == "__main__":
    cli_main(main)
