"""
Speed claims measured side by side in one process (same inputs, warm-up, median of repeats).

    python bench.py                      # CPU
    python bench.py --device=cuda        # GPU
    python bench.py --quick=True         # tiny sizes (what the tests run)

Rows so far (issue 4/4 lists more: step cost, memory, throughput):
  sampling   KV-cache generation vs nanoGPT-style full recompute of the whole prefix per token;
             tokens/s, ratio, and whether the greedy tokens are identical.
  step cost  one TracIn-GRPO step / one standard GRPO step on the same prompts, per phase
             (seed 000's timing table: generation, reward, grad capture train/val, influence, training)
  influence  train x val gradient inner products: the hooks (ghost / materialised by cost) vs a
             per-sample autograd loop (seed 001's method) vs torch.func vmap; time and max
             relative error against the loop.
Writes the markdown table to bench_<device>.md as well.
"""
import statistics
import time

import torch

from configurator import configure, cli_main

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
    data_root="",         # step cost without a base model: where to build the task data ('' = data/gsm_synth)
    seed=0,
)


def timed(fn, device, repeats):
    """Median seconds of `repeats` calls after one warm-up call; returns (seconds, last result)."""
    sync = torch.cuda.synchronize if "cuda" in device else (lambda: None)
    out = fn()
    times = []
    for _ in range(repeats):
        sync(); t0 = time.perf_counter()
        out = fn()
        sync(); times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def bench_model(device, block_size):
    """The tiny-config GPT (4 layers, 64 wide, vocab 395) with random weights, larger context."""
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=block_size, vocab_size=395, n_layer=4, n_head=4, n_embd=64)).to(device).eval()


@torch.no_grad()
def full_recompute_greedy(model, idx, new_tokens):
    """nanoGPT's generate: the whole sequence through the model for every new token."""
    for _ in range(new_tokens):
        logits, _ = model(idx)
        idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return idx


def bench_sampling(cfg):
    from sample import generate
    dev, n, T = cfg["device"], cfg["n_seq"], cfg["new_tokens"]
    model = bench_model(dev, 32 + T)
    g = torch.Generator().manual_seed(cfg["seed"])
    prompts = torch.randint(1, 394, (n, 32), generator=g)  # eot (394) never in prompts
    t_kv, (idx_kv, _, _) = timed(lambda: generate(model, prompts.tolist(), T, eot_id=-1, temperature=0),
                                 dev, cfg["repeats"])
    t_full, idx_full = timed(lambda: full_recompute_greedy(model, prompts.to(dev), T), dev, cfg["repeats"])
    same = torch.equal(idx_kv.cpu(), idx_full.cpu())
    ratio = t_full / t_kv
    return [("sampling", f"KV cache {n * T / t_kv:,.0f} tok/s vs full recompute {n * T / t_full:,.0f} tok/s "
             f"({n} seqs x {T} new tokens); identical greedy tokens: {same}", f"{ratio:.1f}x", ">= 5x",
             "met" if ratio >= 5 and same else "MISSED")]


def bench_influence(cfg):
    """Hooks vs per-sample loop vs vmap on the same GRPO loss, LoRA r=8 on every projection."""
    import tracin
    from lora import apply_lora
    from torch.func import functional_call, grad, vmap
    from train_grpo import completion_logprobs, grpo_loss, selective_log_softmax
    dev, rows = cfg["device"], []
    for T in cfg["seq_lens"]:
        model = bench_model(dev, 32 + T)
        apply_lora(model, r=8, alpha=16, targets=("c_attn", "c_proj", "c_fc"))
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.02)
        model.train()
        g = torch.Generator().manual_seed(cfg["seed"])
        n_tr, n_va = cfg["n_train"], cfg["n_val"]
        idx = torch.randint(0, 394, (n_tr + n_va, 32 + T), generator=g).to(dev)
        pad = torch.zeros(n_tr + n_va, dtype=torch.long, device=dev)
        mask = torch.ones(n_tr + n_va, T, dtype=torch.long, device=dev)
        adv = torch.randn(n_tr + n_va, generator=g).to(dev)
        tr, va = slice(0, n_tr), slice(n_tr, n_tr + n_va)

        def loss_of(sl):
            logp, _ = completion_logprobs(model, idx[sl], pad[sl], T, 1.0)
            return grpo_loss(logp, logp.detach(), None, adv[sl], mask[sl], 0.0, num_seqs=1)[0]

        def hooks():
            with tracin.install_ghost_hooks(model) as h:
                h.split = "train"; loss_of(tr).backward()
                h.split = "val"; loss_of(va).backward()
                m = tracin.compute_ghost_inner_product_matrix(h.collect("train"), h.collect("val"))
            model.zero_grad(set_to_none=True)
            return m

        params = [p for n, p in model.named_parameters() if ".lora_" in n]

        def loop():
            flat = []
            for i in range(n_tr + n_va):
                gs = torch.autograd.grad(loss_of(slice(i, i + 1)), params)
                flat.append(torch.cat([x.flatten().float() for x in gs]))
            G = torch.stack(flat)
            return G[:n_tr] @ G[n_tr:].T

        pdict = {n: p.detach() for n, p in model.named_parameters() if ".lora_" in n}

        def one(p, x, a):
            logits, _ = functional_call(model, p, (x[None, :-1],), {"keep_last": T})
            lp = selective_log_softmax(logits, x[None, -T:])
            return -(a * lp.mean())

        def vmapped():
            out = vmap(grad(one), in_dims=(None, 0, 0))(pdict, idx, adv)
            G = torch.cat([v.flatten(1).float() for v in out.values()], 1)
            return G[:n_tr] @ G[n_tr:].T

        t_loop, ref = timed(loop, dev, 1)
        t_hooks, got = timed(hooks, dev, cfg["repeats"])
        err = ((got - ref).abs().max() / ref.abs().max()).item()
        try:
            t_vmap, vm = timed(vmapped, dev, cfg["repeats"])
            vmap_txt = f"vmap {t_vmap * 1000:.0f} ms (err {((vm - ref).abs().max() / ref.abs().max()).item():.1e})"
        except Exception as e:  # vmap cannot trace every op; say so instead of failing the bench
            vmap_txt = f"vmap failed: {type(e).__name__}"
        ratio = t_loop / t_hooks
        rows.append((f"influence T={T}", f"{n_tr} train x {n_va} val: hooks {t_hooks * 1000:.0f} ms, loop "
                     f"{t_loop * 1000:.0f} ms, {vmap_txt}; hooks max rel err vs loop {err:.1e}",
                     f"{ratio:.1f}x", ">= 20x, err <= 1e-5", "met" if ratio >= 20 and err <= 1e-5 else "MISSED"))
    return rows


def bench_step_cost(cfg):
    """Standard vs TracIn grpo_step on the same prompts with the same sampling seed, per phase."""
    import os
    import random
    import train_grpo as tg
    from lora import apply_lora, lora_parameters
    from model import load_checkpoint, model_from_checkpoint
    from data.gsm_synth.prepare import load_tokenizer, load_split
    dev = cfg["device"]
    if os.path.exists(cfg["base_ckpt"]):
        ck = load_checkpoint(cfg["base_ckpt"])
        model, data_dir, what = model_from_checkpoint(ck), ck["data_dir"], cfg["base_ckpt"]
    else:  # random weights on the tiny task: same shapes, garbage completions
        from data.gsm_synth.prepare import prepare, ROOT
        data_dir = prepare(2, 10, "+-", 0.55, verbose=False, root=cfg["data_root"] or ROOT)
        model, what = bench_model(dev, 96), "random weights"
    enc = load_tokenizer(data_dir)
    apply_lora(model, 8, 16, 0.0, ("c_attn", "c_proj", "c_fc"))
    model.to(dev)
    rng = random.Random(cfg["seed"])
    train, val = load_split(data_dir, "train"), load_split(data_dir, "val")
    tb = [train[rng.randrange(len(train))] for _ in range(cfg["step_batch_size"])]
    vb = [val[rng.randrange(len(val))] for _ in range(cfg["step_val_batch_size"])]
    amp = torch.autocast("cuda", dtype=torch.bfloat16, enabled="cuda" in dev)
    phases = {}
    for tracin_on in (False, True):
        c = {**tg.defaults, "device": dev, "beta": 0.0, "tracin": tracin_on, "micro_batch_size": 64}
        runs = []
        for r in range(cfg["repeats"] + 1):  # the first is a warm-up
            opt = torch.optim.AdamW(lora_parameters(model), lr=0.0)  # lr 0: the weights stay as they are
            gen = torch.Generator(device=dev).manual_seed(cfg["seed"])
            t0 = time.perf_counter()
            log, _ = tg.grpo_step(model, opt, enc, [e["question"] for e in tb], [e["answer"] for e in tb], c, gen,
                                  amp, ([e["question"] for e in vb], [e["answer"] for e in vb]) if tracin_on else None)
            log["total"] = time.perf_counter() - t0
            runs.append(log)
        phases[tracin_on] = {k: statistics.median(l.get(k, 0.0) for l in runs[1:])
                             for k in ("time/generation", "time/reward", "time/grad_capture_train",
                                       "time/grad_capture_val", "time/influence", "time/policy",
                                       "time/optimizer", "total")}
    s, t = phases[False], phases[True]
    ratio = t["total"] / s["total"]
    detail = (f"{what}; standard: generation {s['time/generation']:.2f} s, training (pass 2 + backward + AdamW) "
              f"{s['time/policy'] + s['time/optimizer']:.2f} s, total {s['total']:.2f} s; TracIn: generation "
              f"{t['time/generation']:.2f} s, grad capture train {t['time/grad_capture_train']:.2f} s, val "
              f"{t['time/grad_capture_val']:.2f} s, influence {t['time/influence']:.3f} s, training "
              f"{t['time/optimizer']:.3f} s, total {t['total']:.2f} s")
    return [("step cost", detail, f"{ratio:.2f}x", "<= 1.3x (seed: 2.0x)", "met" if ratio <= 1.3 else "MISSED")]


def main(argv):
    cfg = configure(defaults, argv)
    if cfg["quick"]:
        cfg.update(n_seq=4, new_tokens=16, n_train=4, n_val=2, seq_lens=(8,), repeats=1, step_batch_size=2,
                   step_val_batch_size=2)
    torch.manual_seed(cfg["seed"])
    rows = bench_sampling(cfg) + bench_step_cost(cfg) + bench_influence(cfg)
    dev_name = torch.cuda.get_device_name() if "cuda" in cfg["device"] else "CPU"
    lines = [f"bench.py on {dev_name}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}", "",
             "| row | measured | ratio | target | verdict |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {' | '.join(r)} |" for r in rows]
    text = "\n".join(lines)
    print(text)
    if not cfg["quick"]:
        with open(f"bench_{cfg['device'].split(':')[0]}.md", "w") as f:
            f.write(text + "\n")
    return rows


if __name__ == "__main__":
    cli_main(main)
