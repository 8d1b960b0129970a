# notebooks/one_step.ipynb, the walk through one GRPO step and one TracIn step:
#   - test_notebook_runs: every cell runs headless (nbclient, kernel python3, 300 s per cell,
#     cwd notebooks/ as Jupyter gives it); skipped with the reason when nbclient or ipykernel is
#     missing.
#     On a fresh clone its set-up cell trains the tiny base into out/base first (minutes, once).
#   - test_notebook_reimplements_nothing: no code cell defines a function or class of a name the
#     project defines (ast over every .py file outside tests/), and each step's cells (metadata
#     "step") call the project functions that step is made of.
# Run: python -m pytest -q tests/test_notebook.py
import ast
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "one_step.ipynb")

# step -> project functions its cells must call, in train_grpo.grpo_step's and
# tracin.tracin_backward's order
STEP_CALLS = {
    "grpo-1": {"encode_prompt"},
    "grpo-2": {"sample_rollouts"},
    "grpo-3": {"score_rollouts", "compute_group_advantages"},
    "grpo-4": {"rank_part", "completion_logprobs", "disable_lora"},
    "grpo-5": {"completion_logprobs"},
    "grpo-6": {"grpo_loss", "policy_backward"},
    "grpo-7": {"update"},
    "tracin-0": {"planted_answer", "make_rollouts", "reference_solutions"},
    "tracin-1": {"install_ghost_hooks", "ghost_mode", "policy_backward"},
    "tracin-2": {"informative_rows", "policy_backward", "summed_gradient"},
    "tracin-3": {"per_sample_grads", "summed_inner_products", "completion_logprobs", "grpo_loss"},
    "tracin-4": {"select_rollouts"},
    "tracin-5": {"subset_gradients", "update"},
}


def code_cells():
    with open(NOTEBOOK, encoding="utf-8") as f:
        nb = json.load(f)
    return [("".join(c["source"]), c.get("metadata", {}).get("step"))
            for c in nb["cells"] if c["cell_type"] == "code"]


def project_definitions():
    """Names of every function and class defined in the project's .py files outside tests/."""
    names = set()
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if not x.startswith(".") and x not in
                   ("tests", "out", "notebooks", "__pycache__")]
        for f in files:
            if f.endswith(".py"):
                with open(os.path.join(d, f), encoding="utf-8") as src:
                    tree = ast.parse(src.read())
                names |= {n.name for n in ast.walk(tree) if isinstance(
                    n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    return names


def called(tree):
    """Names of the functions a cell calls: f(...) and x.f(...)."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            out.add(n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", None))
    return out


def test_notebook_reimplements_nothing():
    own = project_definitions()
    assert {"grpo_step", "tracin_backward", "policy_backward"} <= own  # the walk finds the project
    calls = {}
    for source, step in code_cells():
        tree = ast.parse(source)
        defined = {n.name for n in ast.walk(tree)
                   if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        assert not defined & own, f"the notebook redefines project names {defined & own}"
        if step:
            calls.setdefault(step, set()).update(called(tree))
    assert set(calls) == set(STEP_CALLS), f"steps in the notebook: {sorted(calls)}"
    for step, need in STEP_CALLS.items():
        assert need <= calls[step], f"{step} does not call {need - calls[step]}"
        assert calls[step] & own, step


def test_notebook_runs(monkeypatch):
    nbformat = pytest.importorskip("nbformat", reason="pip install nbformat nbclient ipykernel")
    nbclient = pytest.importorskip("nbclient", reason="pip install nbclient ipykernel")
    pytest.importorskip("ipykernel", reason="pip install ipykernel: the python3 kernel")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the kernel inherits it: tiny model, one thread
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}})
    client.execute()  # raises CellExecutionError on any cell's error; the file is not written
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs)
    assert "exactly 0: True" in text and "all exactly 1: True" in text
    assert "LoRA off == base exactly: True" in text


# ---- a cell interrupted (Ctrl-C, the stop button) leaves nothing on the model; started outside
# the project, the first cell says where to start. The cells' own source runs here (exec) on a
# tiny model, the project function it waits on replaced by one that is interrupted.

def cell(step, nth=0):
    return [source for source, s in code_cells() if s == step][nth]


def interrupted(*args, **kwargs):
    raise KeyboardInterrupt


def hooks_left(model):
    return [name for name, m in model.named_modules()
            if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks]


@pytest.fixture
def world():
    """What the cells before the one under test leave: a tiny model with LoRA, its optimizer."""
    import contextlib
    import time

    import torch

    from cfg_calls import step_of
    from conftest import build_gpt
    from runs.metrics import PhaseTimer
    from lora import apply_lora, lora_parameters
    model = build_gpt()
    apply_lora(model, 2, 4, 0.0, ("c_attn",))
    optimizer = torch.optim.AdamW(lora_parameters(model), lr=1e-3)
    cfg = {"seed": 0, "micro_batch_size": 4, "temperature": 1.0, "beta": 0.0,
           "reward_funcs": ("correctness",), "reward_weights": (1.0,)}
    return dict(model=model, optimizer=optimizer, cfg=cfg, torch=torch, time=time, amp=contextlib.nullcontext(),
                contextlib=contextlib, enc=None, prompts=[[1, 2]], answers=[3], T=2,
                rollouts=None, rollouts_t=None, rank_part=a_batch, step=step_of(cfg), timer=PhaseTimer())


def a_batch(rollouts):
    from types import SimpleNamespace
    return SimpleNamespace(idx=None, pad_left=None)


@pytest.mark.parametrize("step, waits_on", [("grpo-2", "sample_rollouts"),
                                            ("grpo-4", "completion_logprobs"),
                                            ("tracin-1", "policy_backward")])
def test_a_cell_interrupted_leaves_no_hook_behind(world, monkeypatch, step, waits_on):
    """Before: the sampling cell's forward hook stayed on the model; run again, every forward
    was counted twice, and the next cell failed with KeyError 'cache'."""
    import grpo
    monkeypatch.setattr(grpo, waits_on, interrupted)
    monkeypatch.setattr(grpo, "rank_part", a_batch)
    world[waits_on] = interrupted  # a name an earlier cell imported
    with pytest.raises(KeyboardInterrupt):
        exec(cell(step), world)
    assert hooks_left(world["model"]) == []
    assert not world["optimizer"]._optimizer_step_pre_hooks  # ghost_mode's refusal taken off


def test_the_validation_cell_interrupted_takes_the_capture_off(world, monkeypatch):
    import contextlib

    import tracin
    from ghost import ghost_mode, install_ghost_hooks
    capture = contextlib.ExitStack()  # what the capture cell (tracin-1) leaves open for this one
    world.update(capture=capture, hooks=capture.enter_context(install_ghost_hooks(world["model"])))
    capture.enter_context(ghost_mode(world["optimizer"]))
    assert hooks_left(world["model"])
    monkeypatch.setattr(tracin, "informative_rows", lambda batch, loss_type: batch)
    world.update(policy_backward=interrupted, val_batch=None)
    with pytest.raises(KeyboardInterrupt):
        exec(cell("tracin-2"), world)
    assert hooks_left(world["model"]) == []


@pytest.mark.parametrize("start, given", [("notebooks", {}), ("", {}), ("data/countdown", {}),
                                          ("ELSEWHERE", {"JPY_SESSION_NAME": NOTEBOOK}),
                                          ("ELSEWHERE", {"__vsc_ipynb_file__": NOTEBOOK})])
def test_the_first_cell_finds_the_project_root(tmp_path, monkeypatch, start, given):
    import sys
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.chdir(tmp_path if start == "ELSEWHERE" else os.path.join(ROOT, start))
    ns = {k: v for k, v in given.items() if k.startswith("__")}
    for k, v in given.items():
        if not k.startswith("__"):
            monkeypatch.setenv(k, v)
    exec(code_cells()[0][0], ns)
    assert os.getcwd() == ROOT and sys.path[0] == ROOT


def test_the_first_cell_outside_the_project_says_where_to_start(tmp_path, monkeypatch):
    """Before: the working directory stayed where it was; the set-up cell then failed with
    ModuleNotFoundError: No module named 'train_base'."""
    import sys
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RuntimeError, match=f"{tmp_path} is not inside the project: start Jupyter "
                                           "in the project's folder"):
        exec(code_cells()[0][0], {})
    assert os.getcwd() == str(tmp_path)


# ---- the set-up cell asks the training script's start-up checks: a base whose context is too short
# for the longest question + max_new_tokens ends in the script's one line, before any sampling.

def test_the_set_up_cell_refuses_what_the_script_refuses(tiny_setup, monkeypatch):
    """Before: model.generate's assertion '30 + max_new_tokens=40 > 64' from a later cell."""
    pytest.importorskip("matplotlib", reason="the set-up cell imports matplotlib: pip install matplotlib")
    from configurator import UserError
    monkeypatch.chdir(ROOT)
    source = code_cells()[1][0]
    assert 'max_new_tokens=40, device="cpu"' in source  # the line the case below changes
    given = f'max_new_tokens=127, device="cpu", base_ckpt="{tiny_setup}"'  # the tiny base's context: 128
    with pytest.raises(UserError) as e:
        exec(source.replace('max_new_tokens=40, device="cpu"', given), {"time": __import__("time"), "os": os})
    said = str(e.value)
    assert "\n" not in said and said.startswith("config key 'max_new_tokens' = 127 is not allowed: the longest")
    assert "must fit the base's context of 128: give at most" in said
