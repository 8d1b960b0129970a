"""
Two rows of bench/run.py about generation, the largest phase of every GRPO step:

  limits        one standard GRPO step (bench.memory.project_grpo_step: sampling with the LoRA folded in,
                then the reference and the policy pass with its backward) at 6 x 384 (vocabulary 96) and GPT-2
                small (12 x 768, vocabulary 50,304), float32 and bf16 (the frozen base stored in bf16 under bf16
                autocast), each phase against its matmul limit: its matmul FLOPs at the matmul rate measured
                here, in the same run, on the phase's own shapes (rows = the decode batch for generation, every
                token of the batch for the two passes). A forward costs 2 x tokens x (the linear layers'
                weights, the head's where logits are taken) plus attention's 4 x context x width per token and
                layer; the policy pass counts twice that (the frozen base's backward forms input gradients
                only; the LoRA factors' few extra FLOPs are left out). With --compile, sampling's decode step is
                compiled (scale/compiled.py; the first, untimed step compiles).
  vs_generate   greedy sampling of the same prompts and number of new tokens with model.generate and with
                transformers' generate, on the same random GPT-2 weights (a directory written here, read by
                from_pretrained), at the tiny shape (4 x 128), 6 x 384 and GPT-2 small, float32 and bf16;
                the ratio, and how many rows' tokens are identical. A note instead when transformers is missing.
                With --compile=MODE (a torch.compile mode; 'default' = inductor's), the project's generate with
                the decode step compiled too (scale/compiled.py): the three interleaved, once per round; the
                first compiled call's seconds beyond a compiled call (the compile), the saving per call, and
                the call (a GRPO step samples once) at which the compile has paid for itself.
  compiled      pass 1 of compile_steps GRPO steps as grpo.sample_rollouts runs it (LoRA folded in, except
                under CUDA graphs; sampled at temperature 1, the same uniforms for both), eager and with the
                decode step compiled
                (scale/compiled.py, mode --compile or inductor's default), one after the other each step;
                prompts of a random length up to thr_prompt_len every step, so the cache's length changes
                as in a run. Graphs compiled, compile seconds, the median saving per step, the step at which
                the compile has paid for itself (target: within config/tiny_grpo.py's 150 steps), and the
                rows whose tokens differ from the eager ones.
"""
import math
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F

from bench.half import halved
from bench.memory import lora_gpt, project_grpo_step, step_inputs
from grpo import lora_for_sampling
from lora import folded_for_sampling
from lora import lora_parameters
from pretrained.hf import from_pretrained
from model import GREEDY, generate, uniforms
from configurator import UserError
from scale.compiled import CompiledDecode, check_compile

LIMIT_SHAPES = ((6, 6, 384, 96), (12, 12, 768, 50304))                    # (layers, heads, width, vocabulary)
GENERATE_SHAPES = ((4, 4, 128, 395), (6, 6, 384, 96), (12, 12, 768, 50257))
TARGET_LIMIT, TARGET_GENERATE = 2.0, 2.0  # generation within 2x of its limit; sampling >= 2x transformers'
DEMO_STEPS = 150  # config/tiny_grpo.py's max_iters: a compile that pays back later is off by default


def matmul_rate(width, vocab, rows, dtype, device, repeats=3):
    """FLOP/s of the linear layers of one block and the head (gpt2 layout) on `rows` rows, in `dtype`."""
    g = torch.Generator().manual_seed(0)
    W = [torch.randn(o, i, generator=g).to(device, dtype) for o, i in
         ((3 * width, width), (width, width), (4 * width, width), (width, 4 * width), (vocab, width))]
    x = [torch.randn(rows, w.size(1), generator=g).to(device, dtype) for w in W]
    sync = torch.cuda.synchronize if "cuda" in device else (lambda: None)

    def once():
        for xi, w in zip(x, W):
            F.linear(xi, w)
    once()
    times = []
    for _ in range(repeats):
        sync(); t0 = time.perf_counter()
        once()
        sync(); times.append(time.perf_counter() - t0)
    return 2 * rows * sum(w.numel() for w in W) / statistics.median(times)


def forward_flops(n_layer, width, vocab, rows, tokens, context, head_tokens):
    """Matmul FLOPs of a forward of `rows` sequences of `tokens` new tokens seeing `context` earlier ones
    (mean), logits for `head_tokens` of them."""
    blocks = 2 * rows * tokens * n_layer * (12 * width * width + 2 * width * (context + tokens / 2))
    return blocks + 2 * rows * head_tokens * width * vocab


def bench_limits(cfg):
    dev, rows = cfg["device"], []
    B, G, P, T = cfg["thr_prompts"], cfg["thr_group"], cfg["thr_prompt_len"], cfg["thr_new_tokens"]
    N = B * G
    for n_layer, n_head, width, vocab in cfg["limit_shapes"]:
        m32 = lora_gpt(n_layer, n_head, width, vocab, P + T, cfg["seed"], dev)
        prompts, adv = step_inputs(B, G, P, vocab, cfg["seed"])
        gen_flops = forward_flops(n_layer, width, vocab, B, P, 0, 1) + \
            sum(forward_flops(n_layer, width, vocab, N, 1, P + t, 1) for t in range(T - 1))
        pass_flops = forward_flops(n_layer, width, vocab, N, P + T - 1, 0, T)  # reference; policy: twice
        m16 = halved(m32)  # copied before anything is compiled (a deep copy would take m32's compiled step along)
        for name, dtype in (("float32", torch.float32), ("bf16", torch.bfloat16)):
            model = m32 if dtype == torch.float32 else m16
            opt = torch.optim.AdamW(lora_parameters(model), lr=1e-5)
            amp = torch.autocast(torch.device(dev).type, dtype=torch.bfloat16, enabled=dtype != torch.float32)
            # with --compile, the decode step compiled (in the first, untimed run)
            runs = [project_grpo_step(model, opt, prompts, G, T, adv.to(dev), amp, cfg["seed"] + r, beta=0.04,
                                      micro_batch_size=N, compile_mode=cfg["compile"])[3]
                    for r in range(cfg["limit_repeats"] + 1)][1:]
            t = {k: statistics.median(r[k] for r in runs) for k in ("generation", "reference", "policy")}
            decode_rate = matmul_rate(width, vocab, N, dtype, dev)
            pass_rate = matmul_rate(width, vocab, N * (P + T - 1), dtype, dev)
            limit = {"generation": gen_flops / decode_rate, "reference": pass_flops / pass_rate,
                     "policy": 2 * pass_flops / pass_rate}
            dist = {k: t[k] / limit[k] for k in t}
            detail = (f"{n_layer} x {width}, vocab {vocab}, {N} rows x {P} + {T} tokens, {name}: matmul rate "
                      f"{decode_rate / 1e9:.0f} GFLOP/s at {N} rows, {pass_rate / 1e9:.0f} at {N * (P + T - 1)}; "
                      + ", ".join(f"{k} {t[k]:.3f} s vs limit {limit[k]:.3f} s ({dist[k]:.1f}x)" for k in t))
            goal = f"generation <= {TARGET_LIMIT:.0f}x its limit"
            verdict = ("met" if dist["generation"] <= TARGET_LIMIT else "MISSED") if (n_layer, width) == (6, 384) \
                else "n/a (target at 6 x 384)"
            rows.append((f"matmul limit, {n_layer} x {width} {name}" + (", decode compiled" if cfg["compile"] else ""), detail, f"generation {dist['generation']:.2f}x",
                         goal, verdict))
    return rows


MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def bench_decode_profile(cfg):
    """Where generation's time goes besides its matmuls: pass 1 (LoRA folded in, 8 x 8 rows, eager) under
    torch.profiler, its self CPU time summed by operator: the matmuls' share, the other operators that take
    the most, and the operator calls per decode step (each costs a dispatch whatever its size)."""
    from torch.profiler import ProfilerActivity, profile
    dev, rows = cfg["device"], []
    B, G, P, T = cfg["thr_prompts"], cfg["thr_group"], cfg["thr_prompt_len"], cfg["thr_new_tokens"]
    for n_layer, n_head, width, vocab in cfg["limit_shapes"]:
        m32 = lora_gpt(n_layer, n_head, width, vocab, P + T, cfg["seed"], dev).eval()
        prompts = step_inputs(B, G, P, vocab, cfg["seed"])[0].tolist()
        for name, dtype in (("float32", torch.float32), ("bf16", torch.bfloat16)):
            model = m32 if dtype == torch.float32 else halved(m32)
            amp = torch.autocast(torch.device(dev).type, dtype=torch.bfloat16, enabled=dtype != torch.float32)
            with amp, folded_for_sampling(model):
                u = uniforms(T, len(prompts) * G, 0, dev)
                generate(model, prompts, T, eot_id=(), num_samples=G, u=u)          # warm-up
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    generate(model, prompts, T, eot_id=(), num_samples=G, u=u)
            ops = {e.key: (e.self_cpu_time_total, e.count) for e in prof.key_averages()}
            total = sum(t for t, _ in ops.values())
            mm = sum(ops[k][0] for k in MATMULS if k in ops)
            rest = sorted(((t, k) for k, (t, _) in ops.items() if k not in MATMULS), reverse=True)[:6]
            calls = sum(c for _, c in ops.values()) / T
            detail = (f"{n_layer} x {width}, vocab {vocab}, {B * G} rows x {P} + {T} tokens, {name}: "
                      f"{total / 1e6:.3f} s of operator self time, matmuls {mm / total:.0%}; then "
                      + ", ".join(f"{k} {t / total:.0%}" for t, k in rest) + f"; {calls:.0f} operator calls per token")
            rows.append((f"generation profile, {n_layer} x {width} {name}", detail, f"matmuls {mm / total:.0%}",
                         "(explains the limits row)", "n/a"))
    return rows


def interleaved_calls(variants, device, repeats):
    """({name: median seconds, 'first': the first call of the last variant}, {name: last output}): every
    variant once per round, a warm-up round first, so that a slow spell of a shared machine hits all alike."""
    sync = torch.cuda.synchronize if "cuda" in device else (lambda: None)
    times, out = {k: [] for k in variants}, {}
    for r in range(repeats + 1):
        for k, fn in variants.items():
            sync(); t0 = time.perf_counter()
            out[k] = fn()
            sync(); times[k].append(time.perf_counter() - t0)
    return {"first": times[k][0], **{k: statistics.median(v[1:]) for k, v in times.items()}}, out


def hf_pair(n_layer, n_head, width, vocab, block, dtype, seed, tmp):
    """(transformers GPT2LMHeadModel, the project's from_pretrained of the same directory), in dtype."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging
    logging.disable_progress_bar()  # save_pretrained's bars are not bench output
    torch.manual_seed(seed)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=n_layer, n_head=n_head, n_embd=width, vocab_size=vocab,
                                    n_positions=block, bos_token_id=0, eos_token_id=0)).eval()
    hf.save_pretrained(tmp)
    return hf.to(dtype), from_pretrained(tmp, dtype).eval()


def bench_vs_generate(cfg):
    try:
        import transformers  # noqa: F401  (a test and benchmark reference only)
    except ImportError:
        return [("sampling vs transformers generate", "transformers is not installed: pip install transformers",
                 "n/a", f">= {TARGET_GENERATE:.0f}x at every shape and dtype", "n/a")]
    dev, rows = cfg["device"], []
    n, P, T = cfg["gen_rows"], cfg["thr_prompt_len"], cfg["thr_new_tokens"]
    for n_layer, n_head, width, vocab in cfg["generate_shapes"]:
        prompts = torch.randint(1, vocab, (n, P), generator=torch.Generator().manual_seed(cfg["seed"]))
        for name, dtype in (("float32", torch.float32), ("bf16", torch.bfloat16)):
            with tempfile.TemporaryDirectory() as tmp:
                hf, ours = hf_pair(n_layer, n_head, width, vocab, P + T, dtype, cfg["seed"], tmp)
            hf, ours = hf.to(dev), ours.to(dev)
            amp = torch.autocast(torch.device(dev).type, dtype=torch.bfloat16, enabled=dtype != torch.float32)
            ids = prompts.to(dev)

            def theirs():
                with torch.no_grad():
                    return hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=T, min_new_tokens=T,
                                       do_sample=False, pad_token_id=0, eos_token_id=None)[:, P:]

            def project():
                with amp:
                    return generate(ours, prompts.tolist(), T, eot_id=(), sampling=GREEDY)[0][:, P:]

            decode = CompiledDecode(ours, dev, cfg["compile"]) if cfg["compile"] else None

            def compiled():
                with amp:
                    return generate(ours, prompts.tolist(), T, eot_id=(), sampling=GREEDY, decode=decode)[0][:, P:]
            variants = dict(theirs=theirs, project=project, **({"compiled": compiled} if cfg["compile"] else {}))
            t, out = interleaved_calls(variants, dev, cfg["repeats"])
            same = int((out["theirs"].cpu() == out["project"].cpu()).all(1).sum())
            ratio = t["theirs"] / t["project"]
            detail = (f"{n_layer} x {width}, vocab {vocab}, {n} prompts of {P} + {T} greedy tokens, {name}: "
                      f"transformers {t['theirs']:.3f} s, project {t['project']:.3f} s; identical tokens in {same} of {n} rows")
            if cfg["compile"]:
                saving, compile_s = t["project"] - t["compiled"], t["first"] - t["compiled"]
                payback = f"pays back at call {math.ceil(compile_s / saving)}" if saving > 0 else "never pays back"
                detail += (f"; compiled ({cfg['compile']}) {t['compiled']:.3f} s ({t['theirs'] / t['compiled']:.2f}x "
                           f"transformers'), compile {compile_s:.1f} s, {payback}; compiled tokens = eager in "
                           f"{int((out['compiled'].cpu() == out['project'].cpu()).all(1).sum())} of {n} rows")
            rows.append((f"sampling vs transformers generate, {n_layer} x {width} {name}", detail, f"{ratio:.2f}x",
                         f">= {TARGET_GENERATE:.0f}x", "met" if ratio >= TARGET_GENERATE else "MISSED"))
    return rows



def bench_compiled(cfg):
    dev, rows, mode = cfg["device"], [], cfg["compile"] or "default"
    try:
        check_compile(dev)
    except UserError as e:
        return [("compiled decode step", str(e), "n/a", f"pays back within {DEMO_STEPS} steps", "n/a")]
    B, G, P, T, steps = cfg["thr_prompts"], cfg["thr_group"], cfg["thr_prompt_len"], cfg["thr_new_tokens"], \
        cfg["compile_steps"]
    sync = torch.cuda.synchronize if "cuda" in dev else (lambda: None)
    for n_layer, n_head, width, vocab in cfg["compile_shapes"]:
        for name, dtype in (("float32", torch.float32), ("bf16", torch.bfloat16)):
            model = lora_gpt(n_layer, n_head, width, vocab, P + T, cfg["seed"], dev).eval()
            amp = torch.autocast(torch.device(dev).type, dtype=torch.bfloat16, enabled=dtype != torch.float32)
            g = torch.Generator().manual_seed(cfg["seed"])
            t, compiled_decode = {"eager": [], "compiled": []}, CompiledDecode(model, dev, mode)
            graphs0, compiling, differ = torch._dynamo.utils.counters["stats"]["unique_graphs"], [], 0
            for s in range(steps):
                lengths = torch.randint(max(1, P // 2), P + 1, (B,), generator=g).tolist()
                prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]
                u = torch.rand(T, B * G, generator=g).to(dev)
                out = {}
                for variant in t:
                    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
                    decode = compiled_decode if variant == "compiled" else None
                    with amp, lora_for_sampling(model, decode):  # as grpo.sample_rollouts
                        sync(); t0 = time.perf_counter()
                        out[variant] = generate(model, prompts, T, eot_id=(), num_samples=G, u=u,
                                                decode=decode)[0]
                        sync(); t[variant].append(time.perf_counter() - t0)
                    if torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs:
                        compiling.append(s)  # this step compiled a graph: its time is compile + step
                differ += int((out["eager"] != out["compiled"]).any(1).sum())  # rows whose tokens differ
            warm = [s for s in range(1, steps) if s not in compiling]  # step 0 also warms the eager path up
            eager = statistics.median(t["eager"][s] for s in warm)
            comp = statistics.median(t["compiled"][s] for s in warm)
            compile_s = sum(t["compiled"][s] - comp for s in compiling)
            saving = eager - comp
            payback = math.ceil(compile_s / saving) if saving > 0 else None
            graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs0
            detail = (f"{n_layer} x {width}, vocab {vocab}, {B} prompts of {max(1, P // 2)}-{P} tokens x {G} samples "
                      f"+ {T} tokens, {name}, {steps} steps: eager {eager:.3f} s, compiled ({mode}) {comp:.3f} s per "
                      f"step; {graphs} graph(s) compiled (steps {compiling}), {compile_s:.1f} s; "
                      + (f"pays back at step {payback}" if payback else "never pays back")
                      + f"; tokens differ from eager in {differ} of {steps * B * G} rows")
            rows.append((f"compiled decode step, {n_layer} x {width} {name}", detail, f"{eager / comp:.2f}x",
                         f"pays back within {DEMO_STEPS} steps",
                         "met" if payback is not None and payback <= DEMO_STEPS else "MISSED"))
    return rows
