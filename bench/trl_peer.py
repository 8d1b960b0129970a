"""
The project's side of the TRL GRPOTrainer comparison: one standard GRPO step at the TRL peer
benchmark's exact size, timed as that benchmark times TRL's (warm-up steps, then the median).

    python bench/trl_peer.py --timed=5                    # float32
    python bench/trl_peer.py --timed=5 --dtype=autocast   # float32 weights under bf16 autocast (TRL's bf16=True)
    python bench/trl_peer.py --timed=5 --dtype=bfloat16   # the frozen base stored in bf16 (train_grpo's dtype)
    python bench/trl_peer.py --timed=5 --compile=default  # the decode step compiled (scale/compiled.py, compile=True)

GPT 6 layers / 6 heads / 384 wide, vocab 99, 12-token prompts, 8 prompts x 8 samples x 64 new tokens
(every completion runs to full length: no end token is drawn), beta 0.04, LoRA r 8 alpha 16 on c_attn
and c_proj (attention and MLP c_proj: the same 202,752 trainable numbers as TRL's LoraConfig there),
one micro-batch of 64, clip 1.0, AdamW at lr 1e-5. Rewards are replaced by random advantages
(bench.memory.project_grpo_step). TRL's side: TRL's GRPOTrainer on a random GPT-2 of the same shape
(docs/performance.md has the command); TRL is not a project requirement: install it in its own venv.
"""
import contextlib
import io
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the project root
from configurator import check, check_choice, cli_main, configure, quiet_start  # noqa: E402
quiet_start(__name__)  # a Ctrl-C during the slow imports below (torch) is one line
import torch  # noqa: E402

from bench.half import halved  # noqa: E402
from bench.memory import project_grpo_step, step_inputs  # noqa: E402
from scale.compiled import check_compile  # noqa: E402
from scale.device import check_device  # noqa: E402
from lora import apply_lora, lora_parameters  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

defaults = dict(warmup=1, timed=3, device="cpu", dtype="float32",  # dtype: 'float32', 'autocast', 'bfloat16'
                compile="")  # '' or a torch.compile mode: sampling's decode step compiled (compiled in the warm-up)


def main(argv):
    with contextlib.redirect_stdout(io.StringIO()):  # stdout is the one JSON line; errors are one line
        cfg = configure(defaults, argv)
    check(cfg, "warmup", cfg["warmup"] >= 0, "must be >= 0 (steps run before the timed ones)")
    check(cfg, "timed", cfg["timed"] >= 1, "must be >= 1 (steps whose median is reported)")
    check_choice(cfg, "dtype", ("float32", "autocast", "bfloat16"))
    check_device(cfg["device"])
    check_choice(cfg, "compile", ("", "default", "reduce-overhead", "max-autotune-no-cudagraphs"))
    check(cfg, "warmup", cfg["warmup"] >= 1 or not cfg["compile"], "must be >= 1 with compile (the first step compiles)")
    if cfg["compile"]:
        check_compile(cfg["device"])
    run(cfg)


def run(a):
    """One standard GRPO step at the peer benchmark's size, a["warmup"] + a["timed"] times; the JSON line."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=12 + 64, vocab_size=99, n_layer=6, n_head=6, n_embd=384))
    apply_lora(model, 8, 16, 0.0, ("c_attn", "c_proj"))
    if a["dtype"] == "bfloat16":  # the frozen base in bf16, LoRA float32: what train_grpo.py does with dtype='bfloat16'
        model = halved(model)
    model.to(a["device"])
    opt = torch.optim.AdamW(lora_parameters(model), lr=1e-5)
    prompts, adv = step_inputs(8, 8, 12, 99, 0)
    amp = torch.autocast(torch.device(a["device"]).type, dtype=torch.bfloat16, enabled=a["dtype"] != "float32")
    sync = torch.cuda.synchronize if "cuda" in a["device"] else (lambda: None)
    steps = []
    for r in range(a["warmup"] + a["timed"]):
        sync(); t0 = time.perf_counter()
        # with --compile only the decode step is compiled: every other forward is eager
        _, idx, mask, times = project_grpo_step(model, opt, prompts, 8, 64, adv.to(a["device"]), amp, r, beta=0.04,
                                                micro_batch_size=64, compile_mode=a["compile"])
        sync(); times["step"] = time.perf_counter() - t0
        assert mask.size(1) == 64 and bool(mask.all())  # every completion ran to 64 tokens, as TRL's
        if r >= a["warmup"]:
            steps.append(times)
    med = {k: round(statistics.median(s[k] for s in steps), 4) for k in steps[0]}
    print(json.dumps({"impl": "project", "dtype": a["dtype"], "compile": a["compile"], "torch": torch.__version__,
                      "threads": torch.get_num_threads(),
                      "lora_params": sum(p.numel() for p in lora_parameters(model)),
                      "step_s": [round(s["step"], 4) for s in steps], "median": med}))


if __name__ == "__main__":
    cli_main(main)
