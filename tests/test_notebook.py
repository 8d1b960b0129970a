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
