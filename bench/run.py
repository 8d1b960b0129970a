"""
Speed and memory claims measured side by side in one process (same inputs, warm-up, median of repeats).

    python -m bench                          # CPU, every row (from the project root; elsewhere: python PATH/bench/run.py)
    python -m bench --device=cuda            # GPU
    python -m bench --rows=step_cost,posthoc # some rows only (names as below, spaces as _)
    python -m bench --quick                  # tiny sizes (what the tests run)

Rows:
  sampling   KV-cache generation vs nanoGPT-style full recompute of the whole prefix per token;
             tokens/s, ratio, and whether the greedy tokens are identical.
  step cost  (bench/step.py) one TracIn-GRPO step / one standard GRPO step on the same prompts, per
             phase, validation loss 'pg' (target 2.0x) and 'nll' (target: at most 5 % of a standard
             step beyond its floor, the standard step plus the validation forward and backward
             alone), each with its floor; influence from the summed validation gradient; the same
             kept rollouts as the full-matrix path. Needs the trained tiny base (trained first if
             missing); a batch with no informative group or nothing kept gets no verdict.
  rewards    (bench/step.py) one standard GRPO step with background_rewards off / on, the task's
             rewards and a slow one (slow_reward_ms per completion); reward cache off.
  influence  train x val gradient inner products: the hooks (ghost / materialised by cost) vs the
             per-sample autograd loop of the TracIn documentation (Pruthi et al. 2020) vs
             torch.func vmap; time and max relative error against the loop.
  posthoc    (bench/posthoc.py) post-hoc attribution (find_critical_samples) vs Captum TracInCP on
             the same checkpoints, rollouts and losses: time, max relative difference, Spearman.
             On the task model, then on a random GPT of posthoc_wide's shape (6 x 384).
             Skipped with a note when captum is not installed.
  memory     (bench/memory.py) peak memory of one GRPO step, the project's code (model.generate +
             policy_backward) vs straightforward_grpo_step (keeps sampling logits, full log_softmax,
             deepcopy reference, no del), same inputs and seed, each next to predicted_memory's
             analytic figure. CUDA: max_memory_allocated; CPU: peak RSS of a fresh process per
             variant (a proxy).
  throughput (bench/memory.py) one standard GRPO step at the throughput size: 6 layers x 384,
             8 prompts x 8 completions x 64 tokens, per phase; steps/s, generated tokens/s,
             completions/s (the target is an H100's).
  limits     (bench/decode.py) each phase of one standard GRPO step against its matmul limit (its matmul
             FLOPs at the matmul rate measured in the same run on its shapes), 6 x 384 and GPT-2 small,
             float32 and bf16.
  decode profile (bench/decode.py) pass 1 at the limits row's shapes under torch.profiler: the matmuls' share
             of its operator time, the other operators that take the most, operator calls per token.
  vs generate (bench/decode.py) greedy sampling vs transformers' generate on the same weights, same prompts
             and tokens, at 4 x 128, 6 x 384 and GPT-2 small, float32 and bf16; identical tokens counted;
             with --compile=default, the decode step compiled as well: compile seconds and payback call.
  compiled   (bench/decode.py) pass 1 of GRPO steps, eager vs the decode step compiled (scale/compiled.py):
             graphs compiled, compile seconds, saving per step, the step at which it pays back.
  half precision (bench/half.py) the same step in float32 vs with the frozen base in bf16 under bf16
             autocast (dtype='bfloat16'), per phase, at 4 x 128, 6 x 384 and GPT-2 small (12 x 768,
             vocabulary 50,304); loss and LoRA gradient of both on the same rollouts.
Writes the markdown table to bench_<device>.md as well (every row, not with --quick).
"""
import contextlib
import importlib.util
import io
import os
import sys
import tempfile
import time
import warnings

if __package__ in (None, ""):  # run as a file (python bench/run.py): the project root on the path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# configurator first: a Ctrl-C during the slow imports below (torch) is one line, not a traceback
from configurator import UserError, check, check_finite, cli_main, configure, quiet_start  # noqa: E402
quiet_start(__name__)
import torch
from torch.func import functional_call, grad, vmap

from bench.decode import bench_compiled, bench_decode_profile, bench_limits, bench_vs_generate
from bench.half import bench_half
from bench.memory import bench_memory, bench_throughput
from bench.posthoc import bench_posthoc
from bench.scripts import train_missing_base
from bench.step import bench_model, bench_rewards, bench_step_cost, check_step_tokens, timed
from data.tasks import PROJECT
from ghost import compute_ghost_inner_product_matrix, install_ghost_hooks
from grpo import Divisors, LossKnobs, completion_logprobs, grpo_loss, selective_log_softmax
from lora import apply_lora
from scale.compiled import check_compile
from scale.device import check_device
from model import GREEDY, generate
from runs.checkpoint import load_checkpoint, model_from_checkpoint

defaults = dict(
    device="cpu",
    quick=False,          # small sizes: a smoke run
    repeats=3,
    n_seq=64,             # sampling: sequences
    new_tokens=256,       # sampling: new tokens per sequence
    n_train=64,           # influence: train rollouts
    n_val=16,             # influence: validation rollouts
    seq_lens=(64, 256),   # influence: completion lengths T
    base_ckpt="out/base/ckpt.pt",  # step cost: this base model if it exists, else random weights
    step_batch_size=8,    # step cost: prompts x group_size 8, as config/tiny_tracin.py
    step_val_batch_size=16,
    step_new_tokens=40,   # step cost, rewards: max_new_tokens, as config/tiny_tracin.py
    step_repeats=7,       # step cost, rewards: rounds of every variant; one step is short and the ratio noisy
    data_root="",         # step cost without a base model: where to build the task data ('' = data/gsm_synth)
    slow_reward_ms=20,    # rewards: the slow reward's sleep per completion
    posthoc_prompts=32,   # posthoc: prompts x group rollouts (256), checkpoints, test answers
    posthoc_group=8,
    posthoc_checkpoints=3,
    posthoc_tests=1,
    posthoc_wide=(6, 6, 384),  # posthoc: also a random GPT of (layers, heads, width); () = not
    mem_n_layer=0,        # memory: 0 = by device (CUDA: GPT-2 small, 12 layers; CPU: 2)
    mem_n_head=0,         # memory: 0 = by device (12 / 2)
    mem_n_embd=0,         # memory: 0 = by device (768 / 128)
    mem_vocab=50304,      # memory: GPT-2's vocabulary, padded
    mem_prompts=8,        # memory: prompts x group
    mem_group=8,
    mem_prompt_len=0,     # memory: 0 = by device (32 / 16)
    mem_new_tokens=0,     # memory: 0 = by device (256 / 32)
    thr_n_layer=6,        # throughput size: 6 layers x 384, 8 prompts x 8 completions x 64 tokens
    thr_n_head=6,
    thr_n_embd=384,
    thr_vocab=96,
    thr_prompts=8,
    thr_group=8,
    thr_prompt_len=24,
    thr_new_tokens=64,
    thr_repeats=0,        # throughput: 0 = repeats on CUDA, 1 on CPU (one step takes seconds there)
    half_shapes=((4, 4, 128, 395), (6, 6, 384, 96), (12, 12, 768, 50304)),  # half precision: (layers, heads,
    half_repeats=3,       # width, vocabulary) at the throughput batch; rounds after a warm-up
    limit_shapes=((6, 6, 384, 96), (12, 12, 768, 50304)),  # limits: (layers, heads, width, vocabulary), the
    limit_repeats=1,      # throughput batch; timed steps after a warm-up
    generate_shapes=((4, 4, 128, 395), (6, 6, 384, 96), (12, 12, 768, 50257)),  # vs generate: shapes, and
    gen_rows=64,          # prompts (thr_prompt_len + thr_new_tokens tokens each)
    compile="",           # vs generate: also the compiled decode step (scale/compiled.py) in this torch.compile
                          #   mode ('default': inductor's; 'max-autotune-no-cudagraphs', ...); '' = not
    compile_shapes=((4, 4, 128, 395), (6, 6, 384, 96)),  # compiled: (layers, heads, width, vocabulary) at the
    compile_steps=20,     # throughput batch, and pass 1 of this many steps (mode: compile, '' = 'default')
    rows="",              # comma-separated row names (sampling, step_cost, rewards, influence, posthoc, memory,
    seed=0,               #   throughput, half, limits, vs_generate, compiled); '' = every row
)


# --quick: smoke sizes for every row (what the tests run)
QUICK = dict(n_seq=4, new_tokens=16, n_train=4, n_val=2, seq_lens=(8,), repeats=1, step_repeats=1,
             step_batch_size=2, step_val_batch_size=2, step_new_tokens=8, slow_reward_ms=2,
             posthoc_prompts=2, posthoc_group=2, posthoc_checkpoints=2, posthoc_wide=(1, 2, 32),
             mem_n_layer=1, mem_n_head=2, mem_n_embd=32, mem_vocab=512, mem_prompts=2, mem_group=2,
             mem_prompt_len=8, mem_new_tokens=8, thr_n_layer=1, thr_n_head=2, thr_n_embd=32, thr_prompts=2,
             thr_group=2, thr_prompt_len=8, thr_new_tokens=8, half_shapes=((1, 2, 32, 64),), half_repeats=1,
             limit_shapes=((1, 2, 32, 64),), limit_repeats=1, generate_shapes=((1, 2, 32, 64),), gen_rows=4,
             compile_shapes=((1, 2, 32, 64),), compile_steps=3)


# ---------------------------------------------------------------------------------------------
# sampling: KV cache vs full recompute

@torch.no_grad()
def full_recompute_greedy(model, idx, new_tokens):
    """nanoGPT's generate: the whole sequence through the model for every new token."""
    for _ in range(new_tokens):
        logits, _ = model(idx)
        idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return idx


def bench_sampling(cfg):
    """Greedy tokens for the same random prompts, KV cache (model.generate) vs full recompute."""
    dev, n, T = cfg["device"], cfg["n_seq"], cfg["new_tokens"]
    model = bench_model(dev, 32 + T)
    g = torch.Generator().manual_seed(cfg["seed"])
    prompts = torch.randint(1, 394, (n, 32), generator=g)  # eot (394) never in prompts
    t_kv, (idx_kv, _, _) = timed(lambda: generate(model, prompts.tolist(), T, eot_id=-1, sampling=GREEDY),
                                 dev, cfg["repeats"])
    t_full, idx_full = timed(lambda: full_recompute_greedy(model, prompts.to(dev), T), dev, cfg["repeats"])
    same = torch.equal(idx_kv.cpu(), idx_full.cpu())
    ratio = t_full / t_kv
    return [("sampling", f"KV cache {n * T / t_kv:,.0f} tok/s vs full recompute {n * T / t_full:,.0f} tok/s "
             f"({n} seqs x {T} new tokens); identical greedy tokens: {same}", f"{ratio:.1f}x", ">= 5x",
             "met" if ratio >= 5 and same else "MISSED")]


# ---------------------------------------------------------------------------------------------
# influence: train x val gradient inner products three ways, on the same GRPO loss

def influence_setup(cfg, T):
    """The bench model with LoRA r=8 on every projection (lora_B drawn from N(0, 0.02), so that no
    gradient is zero), in train mode, and n_train + n_val random rows of 32 prompt + T completion
    tokens: no padding, every completion token counted, random advantages."""
    dev = cfg["device"]
    model = bench_model(dev, 32 + T)
    apply_lora(model, r=8, alpha=16, targets=("c_attn", "c_proj", "c_fc"))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)
    model.train()
    n = cfg["n_train"] + cfg["n_val"]
    g = torch.Generator().manual_seed(cfg["seed"])
    idx = torch.randint(0, 394, (n, 32 + T), generator=g).to(dev)
    return model, dict(idx=idx, pad_left=torch.zeros(n, dtype=torch.long, device=dev),
                       mask=torch.ones(n, T, dtype=torch.long, device=dev),
                       advantages=torch.randn(n, generator=g).to(dev))


def batch_loss(model, batch, rows, T):
    """The GRPO loss (beta 0, old log-probs = logp.detach()) of the batch's `rows` (a slice)."""
    logp, _ = completion_logprobs(model, batch["idx"][rows], batch["pad_left"][rows], T, 1.0)
    mask = batch["mask"][rows]
    one = Divisors(num_seqs=1, num_tokens=mask.sum().clamp(min=1).item())  # 'grpo': / 1
    return grpo_loss(logp, logp.detach(), None, batch["advantages"][rows], mask, LossKnobs(beta=0.0), one)[0]


def hook_products(model, batch, T, n_train):
    """The project's way: one batched backward per split under the ghost hooks, then the products."""
    with install_ghost_hooks(model) as h:
        h.split = "train"; batch_loss(model, batch, slice(0, n_train), T).backward()
        h.split = "val"; batch_loss(model, batch, slice(n_train, None), T).backward()
        m = compute_ghost_inner_product_matrix(h.collect("train"), h.collect("val"))
    model.zero_grad(set_to_none=True)
    return m


def loop_products(model, batch, T, n_train):
    """The per-sample autograd loop of the TracIn documentation (Pruthi et al. 2020): one backward per
    row, its LoRA gradients flattened into one vector, then train x val dot products."""
    params = [p for n, p in model.named_parameters() if ".lora_" in n]
    flat = []
    for i in range(batch["idx"].size(0)):
        gs = torch.autograd.grad(batch_loss(model, batch, slice(i, i + 1), T), params)
        flat.append(torch.cat([x.flatten().float() for x in gs]))
    G = torch.stack(flat)
    return G[:n_train] @ G[n_train:].T


def vmap_products(model, batch, T, n_train):
    """torch.func: the gradient of one row's loss, vmapped over the rows, with the same padding-mask
    attention as the hooks and the loop (pad_left = 0)."""
    pdict = {n: p.detach() for n, p in model.named_parameters() if ".lora_" in n}
    pad = batch["pad_left"][:1]

    def one(p, x, a):
        logits, _ = functional_call(model, p, (x[None, :-1],), {"keep_last": T, "pad_left": pad})
        lp = selective_log_softmax(logits, x[None, -T:])
        return -(a * lp.mean())

    out = vmap(grad(one), in_dims=(None, 0, 0))(pdict, batch["idx"], batch["advantages"])
    G = torch.cat([v.flatten(1).float() for v in out.values()], 1)
    return G[:n_train] @ G[n_train:].T


def rel_err(got, ref):
    return ((got - ref).abs().max() / ref.abs().max()).item()


def bench_influence(cfg):
    """Hooks vs per-sample loop vs vmap on the same GRPO loss, LoRA r=8 on every projection, per T."""
    dev, n_tr, n_va, rows = cfg["device"], cfg["n_train"], cfg["n_val"], []
    for T in cfg["seq_lens"]:
        model, batch = influence_setup(cfg, T)
        t_loop, ref = timed(lambda: loop_products(model, batch, T, n_tr), dev, 1)
        t_hooks, got = timed(lambda: hook_products(model, batch, T, n_tr), dev, cfg["repeats"])
        err = rel_err(got, ref)
        try:
            with warnings.catch_warnings():  # CPU SDPA has no vmap batching rule: vmap loops over it (README)
                warnings.filterwarnings("ignore", "There is a performance drop")
                t_vmap, vm = timed(lambda: vmap_products(model, batch, T, n_tr), dev, cfg["repeats"])
            vmap_txt = f"vmap {t_vmap * 1000:.0f} ms (err {rel_err(vm, ref):.1e})"
        except Exception as e:  # vmap cannot trace every op; say so instead of failing the bench
            vmap_txt = f"vmap failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:90]}"
        ratio = t_loop / t_hooks
        rows.append((f"influence T={T}", f"{n_tr} train x {n_va} val: hooks {t_hooks * 1000:.0f} ms, loop "
                     f"{t_loop * 1000:.0f} ms, {vmap_txt}; hooks max rel err vs loop {err:.1e}",
                     f"{ratio:.1f}x", ">= 20x, err <= 1e-5", "met" if ratio >= 20 and err <= 1e-5 else "MISSED"))
    return rows


# ---------------------------------------------------------------------------------------------
# every row, in this order, into one table

ROWS = {fn.__name__[len("bench_"):]: fn for fn in (bench_sampling, bench_step_cost, bench_rewards, bench_influence,
                                                   bench_posthoc, bench_memory, bench_throughput, bench_half,
                                                   bench_limits, bench_decode_profile, bench_vs_generate, bench_compiled)}


# The longest context a bench model is built with: the sampling row's full recompute costs new_tokens^2
# forward positions per sequence, so --new_tokens=100000 would run for days instead of failing.
MAX_CONTEXT = 4096


def is_shape(s, n):
    """A tuple (or list) of n positive ints (a bool is no size)."""
    return isinstance(s, (tuple, list)) and len(s) == n and all(type(v) is int and v > 0 for v in s)


def check_knobs(cfg):
    """Sizes and counts must be positive; the mem_ ones and thr_repeats may be 0 ('by device'); shapes nested
    as their defaults; every bench model's context at most MAX_CONTEXT; numbers finite, the seed 64-bit."""
    check_finite(cfg)
    for k, v in cfg.items():
        if isinstance(v, int) and not isinstance(v, bool) and k != "seed":
            auto = k.startswith("mem_") or k == "thr_repeats"
            check(cfg, k, v >= 0 if auto else v > 0, "must be >= 0 (0 = by device)" if auto else "must be > 0")
    check(cfg, "seq_lens", len(cfg["seq_lens"]) > 0 and all(type(t) is int and t > 0 for t in cfg["seq_lens"]),
          "one or more positive completion lengths, e.g. (64, 256)")
    wide = cfg["posthoc_wide"]
    for key in ("half_shapes", "limit_shapes", "generate_shapes", "compile_shapes"):
        shapes = cfg[key]
        check(cfg, key, len(shapes) > 0 and all(is_shape(s, 4) and s[2] % s[1] == 0 for s in shapes),
              "a tuple of one or more (layers, heads, width, vocabulary), positive, width a multiple of heads, "
              "e.g. ((4, 4, 128, 395),) for one" + (" (this is one shape: wrap it, with the comma)"
                                                    if is_shape(shapes, 4) else ""))
    check(cfg, "posthoc_wide", wide == () or (is_shape(wide, 3) and wide[2] % wide[1] == 0),
          "one (layers, heads, width), positive, width a multiple of heads, e.g. (6, 6, 384); or () for none"
          + (" (not a tuple of shapes)" if len(wide) == 1 and is_shape(wide[0], 3) else ""))
    for key, prompt, new in (("new_tokens", 32, cfg["new_tokens"]), ("seq_lens", 32, max(cfg["seq_lens"])),
                             ("thr_new_tokens", cfg["thr_prompt_len"], cfg["thr_new_tokens"]),
                             ("mem_new_tokens", cfg["mem_prompt_len"] or 32, cfg["mem_new_tokens"] or 256)):
        check(cfg, key, prompt + new <= MAX_CONTEXT, f"its row's model would need a context of {prompt} prompt + {new}"
              f" new tokens; a bench model holds at most {MAX_CONTEXT}: give at most {MAX_CONTEXT - prompt} new tokens")
    unknown = [r for r in chosen_rows(cfg) if r not in ROWS]  # '' between two commas too
    check(cfg, "rows", not unknown, f"unknown row {unknown[0]!r}: give some of {', '.join(ROWS)}, "
          "comma-separated, or '' for every row" if unknown else "")


def chosen_rows(cfg):
    """The row names --rows gives, in its order; [] for every row."""
    return [r.strip() for r in cfg["rows"].split(",")] if cfg["rows"].strip() else []


def check_base(cfg, chosen):
    """The rows that load the trained tiny base (step cost, rewards, posthoc with captum) train it first where it
    is missing (runs/loading.ensure_base), from config/tiny_base.py relative to the working directory: checked
    before the first row, so that a wrong --base_ckpt or directory is an error before any work."""
    needs = {"step_cost", "rewards"} | ({"posthoc"} if importlib.util.find_spec("captum") else set())
    if cfg["quick"] or not needs & set(chosen):
        return
    if os.path.exists(cfg["base_ckpt"]):  # a model directory or a GRPO checkpoint is named as what it is
        rows = ", ".join(r for r in ROWS if r in needs & set(chosen))
        try:
            model_from_checkpoint(load_checkpoint(cfg["base_ckpt"]), cfg["base_ckpt"])
        except UserError as e:
            raise UserError(f"base_ckpt: {e}; the row(s) {rows} measure the tiny task's base, a train_base.py "
                            f"checkpoint such as out/base/ckpt.pt: give one, or leave --base_ckpt out") from None
        return
    if not os.path.isfile(os.path.join("config", "tiny_base.py")):
        raise UserError(f"base_ckpt {cfg['base_ckpt']} not found from {os.getcwd()}: the row(s) "
                        f"{', '.join(r for r in ROWS if r in needs & set(chosen))} need it, and it is trained only "
                        f"from the project root: cd {PROJECT} (or give --base_ckpt=PATH of a trained base, or --quick)")
    train_missing_base(cfg["base_ckpt"], cfg["device"])


def cpu_name():
    """The CPU's model name (Linux), else the platform's word for it."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        import platform
        return platform.processor() or "CPU"


def main(argv):
    cfg = configure(defaults, argv)
    if cfg["quick"]:  # the smoke sizes as defaults, under what argv gives: --quick --repeats=2 keeps 2
        with contextlib.redirect_stdout(io.StringIO()):
            cfg = configure({**defaults, **QUICK}, argv)
    check_knobs(cfg)
    check_device(cfg["device"])  # float32
    modes = ("", "default", *torch._inductor.list_mode_options())
    check(cfg, "compile", cfg["compile"] in modes, f"one of {', '.join(map(repr, modes))} ('' = not compiled)")
    if cfg["compile"]:  # torch.compile there, and a C++ compiler for inductor on CPU
        check_compile(cfg["device"])
    chosen = chosen_rows(cfg) or list(ROWS)
    writes = not cfg["quick"] and len(set(chosen)) == len(ROWS)
    try:  # the table is written after every row: a directory that takes no file is refused now
        if writes:
            tempfile.TemporaryFile(dir=".").close()
    except OSError as e:
        raise UserError(f"cannot write bench_{cfg['device'].split(':')[0]}.md in {os.getcwd()} ({e.strerror}): "
                        "run from a writable directory") from None
    check_base(cfg, chosen)
    if {"step_cost", "rewards"} & set(chosen):
        check_step_tokens(cfg)  # step_new_tokens against the base's context, before any row
    torch.manual_seed(cfg["seed"])
    rows, t0 = [], time.time()
    for name in ROWS:
        if name in chosen:
            print(f"bench: {name} ({time.time() - t0:.0f} s so far)", file=sys.stderr, flush=True)
            rows += ROWS[name](cfg)
    dev_name = torch.cuda.get_device_name() if "cuda" in cfg["device"] else cpu_name()
    lines = [f"python -m bench on {dev_name}, torch {torch.__version__}, {torch.get_num_threads()} CPU threads, "
             f"{time.strftime('%Y-%m-%d')}", "",
             "| row | measured | ratio | target | verdict |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {' | '.join(r)} |" for r in rows]
    text = "\n".join(lines)
    print(text)
    if writes:
        with open(f"bench_{cfg['device'].split(':')[0]}.md", "w") as f:
            f.write(text + "\n")
    return rows


if __name__ == "__main__":
    cli_main(main)
