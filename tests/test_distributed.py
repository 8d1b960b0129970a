# train_grpo.py under torch.distributed (gloo, CPU), 2 processes started with torch.multiprocessing.spawn
# and the environment torchrun would give them, against the same run in one process (the reference).
# Run: python -m pytest -q tests/test_distributed.py
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.multiprocessing as mp

import cfg_calls

import train_base
import train_grpo as tg
from scale.distributed import finish  # each worker ends with it, as configurator.cli_main does under torchrun
from data.prompts import encode_prompt
from rewards import REWARD_FUNCS
from runs.checkpoint import load_checkpoint, model_from_checkpoint
from test_train_grpo import run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def chars(completion, answer):  # conftest's chars_reward, at module level so that spawned processes can use it
    return len(completion) / 10


def task_pays_chars(tasks):
    """TracIn's 'pg' validation batch is scored by the task's own rewards (data/tasks.TASKS): here the
    runs' (test_train_grpo.run), so that a tiny model's validation groups differ and G is not 0."""
    tasks["arith"] = {**tasks["arith"], "rewards": ("correctness", "format", "chars"),
                      "weights": (1.0, 0.5, 1.0)}


# the spawned processes import this file afresh: they run in float32 too, as conftest's float32_runs does
tg.defaults["dtype"] = train_base.defaults["dtype"] = "float32"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world, port, argv, spy):
    """One rank, as torchrun would start it: its environment, then train_grpo.main. spy: a path where this
    rank saves the rows each of its passes 2 and 3 saw and the sizes of the all-reduces it joined."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import grpo
    import rewards
    import tracin
    from scale import compiled
    rewards.REWARD_FUNCS["chars"] = chars
    from data.tasks import TASKS
    task_pays_chars(TASKS)
    seen = {"rows": [], "all_reduce": [], "compiled_steps": 0}
    decode = compiled.CompiledDecode.__call__
    def compiled_step(self, *a):  # noqa: E306
        seen["compiled_steps"] += 1
        return decode(self, *a)
    compiled.CompiledDecode.__call__ = compiled_step
    backward, all_reduce = grpo.policy_backward, torch.distributed.all_reduce
    def counted(model, batch, step, **kw):  # noqa: E306
        seen["rows"].append((len(batch), step.loss.beta))
        return backward(model, batch, step, **kw)
    grpo.policy_backward = tracin.policy_backward = counted
    torch.distributed.all_reduce = lambda t, *a, **kw: seen["all_reduce"].append((t.numel(), str(t.dtype))) \
        or all_reduce(t, *a, **kw)
    tg.main(argv)
    if spy:
        torch.save(seen, f"{spy}.{rank}")
    finish()


def run_ranks(world, base, out, *extra):
    """test_train_grpo.run's arguments, in `world` processes. Returns what each rank's passes saw (worker)."""
    argv = []
    real_main, tg.main = tg.main, argv.extend  # run() builds the argument list; capture it instead
    try:
        run(base, out, *extra)
    finally:
        tg.main = real_main
    spy = str(out) + ".seen"
    mp.spawn(worker, args=(world, free_port(), argv, spy), nprocs=world)
    return [torch.load(f"{spy}.{r}") for r in range(world)]


def assert_each_rank_took_its_share(seen, rows, updates):
    """Every rank's training passes (2 and 3, beta != 0.0 or TracIn's train capture) saw `rows` of the
    batch, not the whole batch, and every rank joined the same all-reduces of float32 LoRA gradients
    (the evaluation's counts and the statistics are float64)."""
    for s in seen:
        assert s["rows"] and {n for n, _ in s["rows"]} == {rows}, s["rows"]
        grads = [n for n, dtype in s["all_reduce"] if dtype == "torch.float32"]
        assert len(grads) >= 2 * updates and s["all_reduce"] == seen[0]["all_reduce"]


def lines(path):
    return [json.loads(l) for l in open(path)]


def assert_same_run(a, b, iters):
    """b (2 processes) made the same steps as a (1 process): samples, logged means and LoRA weights."""
    ra, rb = lines(a / "rollouts.jsonl"), lines(b / "rollouts.jsonl")
    assert [r["iter"] for r in rb] == iters  # every rank's rollouts, once (only rank 0 writes)
    for x, y in zip(ra, rb):
        assert x["completion_tokens"] == y["completion_tokens"] and x["prompts"] == y["prompts"]
        assert x["advantages"] == pytest.approx(y["advantages"], rel=1e-6, abs=1e-7)
    la, lb = lines(a / "log.jsonl"), lines(b / "log.jsonl")
    assert [r["iter"] for r in lb] == [r["iter"] for r in la]
    ev = lambda r: {k: v for k, v in r.items() if k.startswith("test/")}  # noqa: E731
    assert ev(la[0]) and ev(lb[0]) == ev(la[0]) and ev(lb[-1]) == ev(la[-1])  # start and end: counts summed
    for x, y in zip(la[1:], lb[1:]):  # loss and grad_norm catch a normalisation off by the number of ranks
        for k in ("loss", "grad_norm", "kl", "entropy", "reward", "accuracy", "clip_ratio", "completions/mean_length"):
            assert y[k] == pytest.approx(x[k], rel=1e-5, abs=1e-7), k
    wa, wb = load_checkpoint(str(a / "ckpt.pt")), load_checkpoint(str(b / "ckpt.pt"))
    assert wa["iter_num"] == wb["iter_num"] == iters[-1]
    assert wa["rng"]["python"] == wb["rng"]["python"] and torch.equal(wa["rng"]["generator"], wb["rng"]["generator"])
    lrs = [r["lr"] for r in la[1:] for _ in range(wa["config"]["num_iterations"])]  # one per AdamW update
    rows = wa["config"]["batch_size"] * wa["config"]["group_size"]
    positions = load_checkpoint(wa["base_ckpt"])["model_args"]["block_size"]  # at most
    start, tight = load_checkpoint(str(a / "ckpt_000000.pt"))["lora"], []
    states = [wa["optimizer"]["state"][i] for i in range(len(wa["lora"]))]  # lora_parameters' order
    betas = wa["optimizer"]["param_groups"][0]["betas"]
    for k, bound in summation_order_bounds(wa["lora"], states, betas, lrs, rows * positions).items():
        assert ((wb["lora"][k] - wa["lora"][k]).abs() <= bound).all(), k
        tight.append(bound < 0.1 * (wa["lora"][k] - start[k]).abs())  # vs how far the steps moved it
    assert torch.cat([t.flatten() for t in tight]).float().mean() > 0.9  # the bound is not vacuous


EPS32 = torch.finfo(torch.float32).eps  # 2**-23: float32's relative rounding


def summation_order_bounds(weights, states, betas, lrs, terms):
    """Per tensor of a run's checkpoint ({name: weights}, their AdamW states in the same order and
    its betas), how far each element may differ from a run that adds the same float32 gradients in
    another order (one process vs the ranks' all-reduce). lrs: the learning rate of each AdamW
    update (or a bound on it); terms: how many products one gradient element sums (rows x
    positions, at most batch x block_size).
    - A gradient element is a sum of `terms` products: another order rounds it differently by at
      most dg = terms * EPS32 * (the largest of their magnitudes), taken as terms * EPS32 * G, G
      the largest RMS gradient of the element's row (AdamW's sqrt(v_hat): the gradients' own
      magnitude; a row's products share one output gradient, dL/dh or dL/d(Bh)).
    - AdamW's direction m_hat / sqrt(v_hat) moves by at most (1 + sqrt(t)) dg / sqrt(v_hat_i) at its
      t-th update (its bias-corrected weights of the gradients sum to 1 in m_hat; their square
      roots in v_hat sum to at most sqrt(t)), with sqrt(v_hat_i) taken at the last update.
    - An element whose gradient is at the rounding level may take any direction: never more than
      twice AdamW's largest step, |m_hat / sqrt(v_hat)| <= c_t = sqrt(sum_s a_s^2 / b_s) (Cauchy-
      Schwarz, a_s and b_s the bias-corrected weights of gradient s in m_hat and v_hat).
    Summed over the updates with their learning rates; decoupled weight decay only shrinks a
    difference. Far below: the update's own rounding (a few EPS32 of the weight), the later
    gradients' change from weights that differ this little (second order), the clip's common
    factor (AdamW's direction does not see a gradient's scale)."""
    bounds, (beta1, beta2) = {}, betas
    for (k, w), state in zip(weights.items(), states):
        t = int(state["step"])
        assert t == len(lrs) and state["exp_avg_sq"].shape == w.shape
        rms = (state["exp_avg_sq"] / (1 - beta2 ** t)).sqrt()  # sqrt(v_hat), per element
        dg = terms * EPS32 * rms.amax(-1, keepdim=True)  # per row: its terms share an output gradient
        drift = sum(lr * (1 + (u + 1) ** 0.5) for u, lr in enumerate(lrs)) * dg / rms
        drift = torch.where(rms > 0, drift, 0.0)  # never a gradient (a position no row reached): equal
        largest = 2 * sum(lr * adam_step_bound(u + 1, beta1, beta2) for u, lr in enumerate(lrs))
        bounds[k] = torch.minimum(drift, torch.full_like(w, largest))
    return bounds


def adam_step_bound(t, beta1, beta2):
    """The most |m_hat / sqrt(v_hat)| can be at AdamW's t-th update, whatever the gradients."""
    a = [(1 - beta1) * beta1 ** (t - s) / (1 - beta1 ** t) for s in range(1, t + 1)]
    b = [(1 - beta2) * beta2 ** (t - s) / (1 - beta2 ** t) for s in range(1, t + 1)]
    return sum(x * x / y for x, y in zip(a, b)) ** 0.5


def test_two_processes_make_the_single_process_update(tiny_setup, tmp_path, chars_reward):
    one, two = tmp_path / "one", tmp_path / "two"
    run(tiny_setup, one, "--max_iters=3")
    seen = run_ranks(2, tiny_setup, two, "--max_iters=3")
    assert_same_run(one, two, [1, 2, 3])
    assert_each_rank_took_its_share(seen, 2 * 4 // 2, 3)  # 2 prompts x 4 samples, half each
    l0 = load_checkpoint(str(one / "ckpt_000000.pt"))["lora"]  # the steps did move the adapter
    assert not all(torch.equal(l0[k], load_checkpoint(str(one / "ckpt.pt"))["lora"][k]) for k in l0)
    assert sorted(os.listdir(two)) == sorted(os.listdir(one))  # no lock or stray file left by rank 1
    # resume under 2 processes continues exactly: 2 steps, then 1 more, equal to 3 in one go
    three = tmp_path / "three"
    run_ranks(2, tiny_setup, three, "--max_iters=2")
    run_ranks(2, tiny_setup, three, "--max_iters=3", "--init_from=resume")
    assert_same_run(one, three, [1, 2, 3])


def test_token_level_loss_and_two_updates_per_generation(tiny_setup, tmp_path, chars_reward):
    """dapo divides by the tokens of the WHOLE batch, which differ per rank; num_iterations=2 takes the
    old and reference log-probs on each rank's share and lets the clip act."""
    one, two = tmp_path / "one", tmp_path / "two"
    extra = ("--max_iters=2", "--loss_type=dapo", "--num_iterations=2", "--epsilon_low=0.01", "--epsilon_high=0.01")
    run(tiny_setup, one, *extra)
    seen = run_ranks(2, tiny_setup, two, *extra)
    assert_same_run(one, two, [1, 2])
    assert_each_rank_took_its_share(seen, 4, 4)


@pytest.mark.skipif(not any(shutil.which(c) for c in ("g++", "c++", "clang++")),
                    reason="inductor needs a C++ compiler on CPU (CI has g++)")
def test_compiled_decoding_in_two_processes_makes_the_single_process_run(tiny_setup, tmp_path, chars_reward):
    """compile=True under torchrun: each rank decodes its share through its own compiled step (the
    rows of a share are another graph shape than one process's); the run equals one process's."""
    one, two = tmp_path / "one", tmp_path / "two"
    run(tiny_setup, one, "--max_iters=2", "--compile=True")
    seen = run_ranks(2, tiny_setup, two, "--max_iters=2", "--compile=True")
    assert_same_run(one, two, [1, 2])
    assert_each_rank_took_its_share(seen, 4, 2)
    assert all(s["compiled_steps"] > 0 for s in seen)  # each rank sampled through the compiled step


def test_bnpo_counts_every_ranks_micro_batches(tiny_setup, tmp_path, chars_reward):
    """bnpo divides each micro-batch's mean by the number of micro-batches: of the whole batch, every
    rank's (4 rows per rank, micro-batches of 2: 2 per rank, 4 in all, as one process's 8 rows)."""
    one, two = tmp_path / "one", tmp_path / "two"
    extra = ("--max_iters=2", "--loss_type=bnpo", "--micro_batch_size=2")
    run(tiny_setup, one, *extra)
    seen = run_ranks(2, tiny_setup, two, *extra)
    assert_same_run(one, two, [1, 2])
    assert_each_rank_took_its_share(seen, 4, 2)


@pytest.mark.parametrize("extra", [("--tracin_val_loss=nll",), ("--tracin_val_loss=nll", "--tracin_selection=topk"),
                                   ("--tracin_val_loss=pg", "--tracin_selection=topk", "--tracin_topk_frac=0.3"),
                                   ("--tracin_val_loss=pg", "--tracin_influence=matrix")])
def test_tracin_in_two_processes_keeps_the_single_process_rollouts(tiny_setup, tmp_path, chars_reward, extra,
                                                                   monkeypatch):
    """Each rank scores its rollouts against the all-reduced validation gradient of its share of the
    validation rows ('matrix': of every validation row); the kept set (a global top-k threshold too) and the
    update are those of one process."""
    from data.tasks import TASKS
    monkeypatch.setitem(TASKS, "arith", dict(TASKS["arith"]))
    task_pays_chars(TASKS)  # as each rank's worker does
    one, two = tmp_path / "one", tmp_path / "two"
    args = ("--max_iters=3", "--tracin=True", "--tracin_val_batch_size=2", *extra)
    run(tiny_setup, one, *args)
    seen = run_ranks(2, tiny_setup, two, *args)
    assert_same_run(one, two, [1, 2, 3])
    for s in seen:  # each step: the train capture on this rank's 4 of 8 rollouts, then the validation rows
        assert [n for n, beta in s["rows"][::2]] == [4] * 3, s["rows"]
        assert sum(dtype == "torch.float32" for _, dtype in s["all_reduce"]) >= 2 * 3
    ra, rb = lines(one / "rollouts.jsonl"), lines(two / "rollouts.jsonl")
    assert [r["selected"] for r in rb] == [r["selected"] for r in ra]
    assert any(0 < sum(r["selected"]) < len(r["selected"]) for r in ra)  # a real choice was made
    for x, y in zip(ra, rb):  # every rollout's influence, in the single process's order
        assert y["influence"] == pytest.approx(x["influence"], rel=1e-4, abs=1e-9)
    for x, y in zip(lines(one / "log.jsonl")[1:], lines(two / "log.jsonl")[1:]):
        assert y["n_selected"] == x["n_selected"]
        for k in ("influence/mean", "influence/std", "influence/min", "influence/max"):
            assert y[k] == pytest.approx(x[k], rel=1e-4, abs=1e-9), k


def length_answer(text):
    """An 'answer' that even a random model's samples vary in: the completion's length mod 3."""
    return len(text) % 3


def eval_worker(rank, world, port, base, out):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from scale import distributed
    with distributed.process_group("cpu"):
        r = evaluate_in_chunks(base)
        if distributed.is_main():
            torch.save(r, out)
    finish()


def evaluate_in_chunks(base):
    """train_base.evaluate over the 20 test problems in chunks of 3 (7 chunks: 4 on rank 0, 3 on rank 1)."""
    import train_base as tb
    from data.datadir import load_split, load_tokenizer
    from runs.checkpoint import model_from_checkpoint
    ck = load_checkpoint(base)
    model, enc = model_from_checkpoint(ck).eval(), load_tokenizer(ck["data_dir"])
    examples = [{**e, "answer": i % 3} for i, e in enumerate(load_split(ck["data_dir"], "test"))]
    REWARD_FUNCS["correctness"] = lambda text, answer: float(length_answer(text) == answer)  # arith's "correct"
    return tb.evaluate(model, enc, examples, 8, k=3, batch=3, seed=5)


def test_evaluation_shared_by_two_processes_equals_one(tiny_setup, tmp_path, monkeypatch):
    """Whole chunks per rank keep each chunk's pass@k seed (seed + its start) and draws; the counts are summed."""
    monkeypatch.setitem(REWARD_FUNCS, "correctness", REWARD_FUNCS["correctness"])  # restored afterwards
    one = evaluate_in_chunks(tiny_setup)
    assert 0 < one["accuracy"] < 1 and 0 < one["pass@3"] < 1  # both counts depend on what was generated
    mp.spawn(eval_worker, args=(2, free_port(), tiny_setup, str(tmp_path / "r.pt")), nprocs=2)
    assert torch.load(tmp_path / "r.pt") == one


def test_batch_that_does_not_split_is_refused_in_one_line(tiny_setup, tmp_path):
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        "train_grpo.py", f"--base_ckpt={tiny_setup}", f"--out_dir={tmp_path / 'run'}",
                        "--batch_size=3", "--group_size=2"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert errors and set(errors) == {"error: config key 'batch_size' = 3 is not allowed: must split evenly "
                                      "over the 2 processes"}, r.stderr
    assert 'train_grpo.py", line' not in r.stderr and not (tmp_path / "run").exists()  # no traceback of ours


def failing_worker(rank, world, port, argv):
    """Rank 1 meets an error in its first loss; the command line's error handling (cli_main) runs."""
    import grpo
    from configurator import UserError, cli_main
    if rank == 1:
        def planted(*args, **kwargs):
            raise UserError("planted failure")
        grpo.grpo_loss = planted
    cli_main(lambda a: worker(rank, world, port, a, None), argv)


def test_an_error_on_one_rank_ends_every_rank(tiny_setup, tmp_path, capfd):
    """Rank 1 prints its one line and exits at once; rank 0, waiting for it in the gradient all-reduce,
    fails instead of waiting, naming rank 1 and the resume command (the join's limit only keeps a
    regression from hanging the suite)."""
    argv = []
    real_main, tg.main = tg.main, argv.extend
    try:
        run(tiny_setup, tmp_path / "run", "--max_iters=2")
    finally:
        tg.main = real_main
    ctx = mp.start_processes(failing_worker, args=(2, free_port(), argv), nprocs=2, join=False)
    for p in ctx.processes:  # each rank ends by itself: no launcher stops rank 0 here
        p.join(timeout=120)
    codes = [p.exitcode for p in ctx.processes]
    for p in ctx.processes:
        p.kill()
    assert codes == [2, 2]  # rank 1: the user error's status; rank 0: it names the rank it lost
    err = capfd.readouterr().err
    assert "error: rank 1: planted failure" in err and "Traceback" not in err
    lost = f"error: rank 0: rank 1 (PID {ctx.processes[1].pid}) ended during a step"
    assert lost in err and "--init_from=resume" in err


def base_worker(rank, world, port, argv, data_dir):
    """train_base.py in one rank, on test_train_base's tiny task."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import train_base as tb
    from data.datadir import load_tokenizer
    tb.load_task = lambda cfg, verbose=True: (data_dir, load_tokenizer(data_dir))
    tb.main(argv)
    finish()


@pytest.fixture(scope="module")
def tiny_task(tmp_path_factory):  # test_train_base's task
    from data.datadir import load_tokenizer
    from data.gsm_synth.prepare import prepare
    d = prepare(steps=1, max_operand=5, ops="+", n_train=300, n_val=20, n_test=20, num_merges=20,
                verbose=False, root=str(tmp_path_factory.mktemp("d")))
    return d, load_tokenizer(d)


def test_train_base_in_two_processes_makes_the_single_process_updates(tiny_task, tmp_path, monkeypatch):
    """Every rank draws the whole batch and keeps its half; the loss is each rank's share of the whole
    batch's mean (rows hold different numbers of target tokens), the gradients are summed."""
    import train_base as tb
    from test_train_base import ARGS
    monkeypatch.setattr(tb, "load_task", lambda cfg, verbose=True: tiny_task)
    argv = [*ARGS, "--max_iters=12", "--log_interval=4", "--eval_interval=6"]
    tb.main([f"--out_dir={tmp_path / 'one'}", *argv])
    mp.spawn(base_worker, args=(2, free_port(), [f"--out_dir={tmp_path / 'two'}", *argv], tiny_task[0]), nprocs=2)
    a, b = load_checkpoint(str(tmp_path / "one" / "ckpt.pt")), load_checkpoint(str(tmp_path / "two" / "ckpt.pt"))
    assert a["iter_num"] == b["iter_num"] == 12 and a["rng"]["python"] == b["rng"]["python"]
    assert b["metrics"] == a["metrics"] and "accuracy" in a["metrics"]  # the evaluation, shared by the ranks
    assert sorted(os.listdir(tmp_path / "two")) == ["ckpt.pt"]  # rank 0's checkpoint only, no lock left
    model = model_from_checkpoint(a)  # AdamW's groups: matrices, then gains and biases
    params = [n for n, _ in model.named_parameters()]
    order = [n for n in params if a["model"][n].dim() >= 2] + [n for n in params if a["model"][n].dim() < 2]
    states = [a["optimizer"]["state"][i] for i in range(len(order))]
    lr, betas = a["config"]["learning_rate"], a["optimizer"]["param_groups"][0]["betas"]
    terms = a["config"]["batch_size"] * a["model_args"]["block_size"]
    weights = {n: a["model"][n] for n in order}  # lr: the schedule's peak, a bound on every step's
    bounds = summation_order_bounds(weights, states, betas, [lr] * a["iter_num"], terms)
    for k, bound in bounds.items():  # see summation_order_bounds; the tied lm_head is wte
        assert ((b["model"][k] - a["model"][k]).abs() <= bound).all(), k
    tight = torch.cat([(bound < 0.1 * lr).flatten() for bound in bounds.values()])
    assert tight.float().mean() > 0.9  # not vacuous: a tenth of one step's size, or less


def helpers_worker(rank, world, port, out):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    from scale import distributed
    with distributed.process_group("cpu") as device:
        t = [torch.tensor([1.0, 2.0]) * (rank + 1), torch.tensor(rank + 10.0)]
        got = dict(device=device, rank=distributed.rank(), world=distributed.world_size(),
                   sums=[x.tolist() for x in distributed.all_reduce_sum(t)],
                   floats=distributed.sum_floats([0.5 * rank, 1.0]), rows=distributed.shard(6),
                   uneven=[distributed.split(n) for n in (3, 1)],
                   gathered=distributed.all_gather_cat(torch.tensor([rank, rank + 10])).tolist())
        torch.save(got, f"{out}.{rank}")  # each rank's own file: the test reads them in rank order
    finish()


def test_helpers_in_two_processes(tmp_path):
    """Sums, gather order and row shares, against values computed by hand."""
    out = str(tmp_path / "gathered.pt")
    mp.spawn(helpers_worker, args=(2, free_port(), out), nprocs=2)
    g = [torch.load(f"{out}.{r}", weights_only=False) for r in range(2)]
    assert [r["rank"] for r in g] == [0, 1] and all(r["world"] == 2 and r["device"] == "cpu" for r in g)
    assert all(r["sums"] == [[3.0, 6.0], 21.0] and r["floats"] == [0.5, 2.0] for r in g)
    assert [r["rows"] for r in g] == [slice(0, 3), slice(3, 6)]
    assert [r["uneven"] for r in g] == [[slice(0, 2), slice(0, 1)], [slice(2, 3), slice(1, 1)]]  # rank 1 may get none
    assert all(r["gathered"] == [0, 10, 1, 11] for r in g)


def test_helpers_in_one_process_do_nothing():
    from scale import distributed
    assert not distributed.launched() and distributed.setup("cpu") == (0, 1, "cpu")
    t = torch.tensor([1.0])
    assert distributed.all_reduce_sum([t])[0].item() == 1.0 and distributed.sum_floats([2.0]) == [2.0]
    assert distributed.shard(4) == slice(0, 4)
    assert distributed.split(5) == slice(0, 5) and distributed.all_gather_cat(t) is t
    assert not torch.distributed.is_initialized()


SAMPLE_CFG = dict(group_size=3, max_new_tokens=7, temperature=1.0, top_k=0, top_p=0.95, device="cpu")


def sampling_setup():
    """A random model, a tokenizer over bytes and 5 questions of different lengths (the split is uneven)."""
    import tiktoken
    from conftest import build_gpt
    enc = tiktoken.Encoding(name="bytes", pat_str=r".", mergeable_ranks={bytes([i]): i for i in range(256)},
                            special_tokens={"<|endoftext|>": 256})
    questions = ["ab", "a longer question", "c", "dd ee", "the fifth one, longest of them all"]
    from grpo import Prompts
    batch = Prompts([encode_prompt(enc, q) for q in questions], [0] * 5, (), ())
    return build_gpt(seed=3, vocab_size=257, block_size=64), enc, [batch]


def sampling_worker(rank, world, port, out):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import contextlib
    from scale import distributed
    import grpo
    model, enc, batches = sampling_setup()
    seen, real = [], grpo.generate
    grpo.generate = lambda m, prompts, *a, **k: seen.append(len(prompts)) or real(m, prompts, *a, **k)
    with distributed.process_group("cpu"):
        g = torch.Generator().manual_seed(11)
        sampled = cfg_calls.sample_rollouts(model, enc, batches, SAMPLE_CFG, g)
        again = cfg_calls.sample_rollouts(model, enc, batches, SAMPLE_CFG, g)
        torch.save(dict(sampled=sampled, again=again, state=g.get_state(), seen=seen), f"{out}.{rank}")
    finish()


def test_each_rank_samples_its_share_and_all_get_the_single_process_batch(tmp_path):
    """Sampling split over 2 ranks (3 + 2 prompts): each rank's generate sees only its prompts, and the
    gathered ids, padding and masks of two consecutive steps, and the generator state after them,
    equal one process sampling all 5 prompts."""
    import contextlib
    import grpo
    model, enc, batches = sampling_setup()
    g = torch.Generator().manual_seed(11)
    ref = [cfg_calls.sample_rollouts(model, enc, batches, SAMPLE_CFG, g) for _ in range(2)]
    out = str(tmp_path / "sampled")
    mp.spawn(sampling_worker, args=(2, free_port(), out), nprocs=2)
    for rank, share in ((0, 3), (1, 2)):
        got = torch.load(f"{out}.{rank}", weights_only=False)
        assert got["seen"] == [share, share]
        for mine, theirs in zip((got["sampled"], got["again"]), ref):
            assert all(torch.equal(a, b) for a, b in zip(mine, theirs))
        assert torch.equal(got["state"], g.get_state())
    assert ref[0][2].size(1) > 1 and (ref[0][1] > 0).any()  # padding on both sides was exercised


def nan_sampling_worker(rank, world, port, out):
    """sample_rollouts on a model whose embedding of 'z' is NaN: only rank 1's prompts hold a 'z'."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from scale import distributed
    import grpo
    from model import NonFiniteLogits
    model, enc, batches = sampling_setup()
    batches[0].ids[3:] = [encode_prompt(enc, q) for q in ("zz top", "fizz")]  # rank 1's share: 2 of 5
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())  # untied: a NaN input
    with torch.no_grad():  # embedding, not a NaN logit in every row
        model.transformer.wte.weight[ord("z")] = float("nan")
    with distributed.process_group("cpu"):
        try:
            cfg_calls.sample_rollouts(model, enc, batches, SAMPLE_CFG, torch.Generator().manual_seed(11))
            said = None
        except NonFiniteLogits as e:
            said = str(e)
        torch.save(said, f"{out}.{rank}")
    finish()


def test_nan_logits_in_one_ranks_rows_end_the_sampling_on_every_rank(tmp_path):
    """Before: rank 1 raised before the gather and rank 0 waited in it (for the collective's timeout).
    Now every rank raises NonFiniteLogits: the step is skipped everywhere, as in one process."""
    out = str(tmp_path / "nan")
    ctx = mp.spawn(nan_sampling_worker, args=(2, free_port(), out), nprocs=2, join=False)
    deadline = time.time() + 60  # the healthy run takes seconds
    while not ctx.join(timeout=5):  # join returns as each process ends: True once all have
        if time.time() > deadline:  # still running: a rank waits for the other
            for p in ctx.processes:
                p.kill()
            pytest.fail("a rank was left waiting in the gather")
    said = [torch.load(f"{out}.{rank}", weights_only=True) for rank in (0, 1)]
    assert said[0] == "NaN/Inf logits in another process's share of the rows"
    assert said[1] is not None and said[1].startswith("NaN/Inf logits in")
