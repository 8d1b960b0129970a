# The code a reader opens is the code that runs: checked on the source itself (ast), every non-test file.
#   - no function of another project module, no model's forward / new_cache, is replaced at run time
#     (an attribute of an imported project module assigned, setattr on a module, functools.wraps used to
#     rebind a name): every seam is a call in sight;
#   - imports flow one way: no import cycle among the project's modules (every import statement counts,
#     inside functions too), no two top-level folders import each other (through any path), and
#     scale/ (primitives) imports no step file;
#   - the lecture is a ground floor: its files import only each other, scale.distributed and
#     data.prompts; nothing but a script imports a script (sample, train_base, train_grpo, export, analysis/,
#     bench/, experiments/); no module is reached through runpy / importlib / __import__ /
#     sys.modules or handed to a function as an argument;
#   - no attribute of a model or optimizer is assigned outside model.py / lora.py, and no ground-floor
#     file keeps module-level state that its functions change.
# Run: python -m pytest -q tests/test_structure.py
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEP_FILES = {"grpo", "tracin", "sample", "ghost", "rewards", "train_grpo", "train_base"}
SKIP = {"tests", "out", "__pycache__", "notebooks"}


def project_modules():
    """{dotted module name: path} of every .py file outside tests/."""
    mods = {}
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if not x.startswith(".") and x not in SKIP]
        for f in files:
            if f.endswith(".py"):
                name = os.path.relpath(os.path.join(d, f), ROOT)[:-3].replace(os.sep, ".")
                mods[name[:-9] if name.endswith(".__init__") else name] = os.path.join(d, f)
    return mods


MODULES = project_modules()
TREES = {m: ast.parse(open(p, encoding="utf-8").read()) for m, p in MODULES.items()}


def owner(name):
    """The project module an imported dotted name lives in (None: not the project's)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module):
    """{local alias: project module} and the set of project modules `module` imports, anywhere in it."""
    aliases, targets = {}, set()
    for n in ast.walk(TREES[module]):
        if isinstance(n, ast.Import):
            for a in n.names:
                t = owner(a.name)
                if t and t != module:
                    targets.add(t)
                    aliases[a.asname or a.name.split(".")[0]] = owner(a.name.split(".")[0]) or t
        elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
            t = owner(n.module)
            if t and t != module:
                targets.add(t)
            for a in n.names:
                sub = f"{n.module}.{a.name}"
                if sub in MODULES and sub != module:
                    targets.add(sub)
                    aliases[a.asname or a.name] = sub
    return aliases, targets


def replacements(m, tree, aliases):
    """The lines of `tree` that replace a name at run time (aliases: its imported project modules)."""
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign):
            targets = [e for t in n.targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
            wraps = any(isinstance(c, ast.Call) and "wraps" in (getattr(c.func, "attr", ""),
                                                                getattr(c.func, "id", ""))
                        for c in ast.walk(n.value))
            for t in targets:
                if not isinstance(t, ast.Attribute):
                    continue
                if wraps:
                    found.append(f"{m}:{n.lineno} {ast.unparse(t)} = wraps(...)")
                elif isinstance(t.value, ast.Name) and t.value.id in aliases:
                    found.append(f"{m}:{n.lineno} {ast.unparse(t)} = (a project module's name)")
                elif t.attr in ("forward", "new_cache"):
                    found.append(f"{m}:{n.lineno} {ast.unparse(t)} = (a method replaced)")
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "setattr" and n.args:
            first = n.args[0]
            if isinstance(first, ast.Name) and (first.id in aliases or "module" in first.id):
                found.append(f"{m}:{n.lineno} setattr({first.id}, ...)")
    return found


def test_nothing_replaces_a_function_of_another_module_or_a_models_forward():
    found = [line for m, tree in TREES.items() for line in replacements(m, tree, imports(m)[0])]
    assert found == []


@pytest.mark.parametrize("code", [
    "grpo.generate = functools.wraps(grpo.generate)(lambda *a: None)",   # a wrapper installed
    "grpo.update = summed",                                               # a module's function rebound
    "setattr(step_module, 'grpo_updates', f)",                            # rebound by name
    "model.forward, model.new_cache = forward, new_cache",               # a model's methods replaced
])
def test_the_check_sees_each_kind_of_replacement(code):
    """The seams this check rules out, written as the set-up wrappers wrote them, are all found."""
    tree = ast.parse(f"import functools\nimport grpo\n{code}\n")
    assert replacements("snippet", tree, {"grpo": "grpo"})


def cycles():
    """Strongly connected components of more than one module (Tarjan), over every import."""
    graph = {m: imports(m)[1] for m in MODULES}
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_anywhere():
    assert cycles() == []


def folder_loops(graph):
    """Pairs of top-level folders (or files) that reach each other through their modules' imports."""
    top = lambda m: m.split(".")[0]
    reach = {}
    for m, targets in graph.items():
        reach.setdefault(top(m), set()).update(top(t) for t in targets if top(t) != top(m))
    changed = True
    while changed:  # the transitive closure: small enough to iterate
        changed = False
        for a in reach:
            more = set().union(*(reach.get(b, set()) for b in reach[a])) - reach[a]
            changed |= bool(more)
            reach[a] |= more
    return {tuple(sorted((a, b))) for a in reach for b in reach[a] if a != b and a in reach.get(b, ())}


def test_no_two_folders_import_each_other():
    """data/, runs/, pretrained/, ... stand on fileio.py and the lecture, never on each other both ways."""
    assert folder_loops({m: imports(m)[1] for m in MODULES}) == set()


def test_the_folder_check_sees_a_loop_through_a_third_folder():
    graph = {"data.datadir": {"runs.rundir"}, "runs.rundir": {"pretrained.hf"}, "pretrained.hf": {"data.tasks"},
             "data.tasks": set(), "fileio": set()}
    assert folder_loops(graph) == {("data", "pretrained"), ("data", "runs"), ("pretrained", "runs")}


def test_scale_holds_primitives_and_imports_no_step_file():
    down = {(m, t) for m in MODULES if m.startswith("scale") for t in imports(m)[1] if t in STEP_FILES}
    assert down == set()


GROUND = {"model", "lora", "ghost", "grpo", "tracin", "rewards"}  # the lecture (configurator is no part of it)
GROUND_MAY_IMPORT = GROUND | {"scale", "scale.distributed", "data", "data.prompts"}


def is_leaf(m):
    """A script: what a user runs; nothing below it may import it."""
    return m in ("sample", "train_base", "train_grpo", "export") or \
        m.split(".")[0] in ("analysis", "bench", "experiments")


def test_the_ground_floor_imports_nothing_of_the_house():
    up = {(m, t) for m in GROUND for t in imports(m)[1] if t not in GROUND_MAY_IMPORT}
    assert up == set()


def test_only_scripts_import_scripts():
    found = {(m, t) for m in MODULES if not is_leaf(m) for t in imports(m)[1] if is_leaf(t)}
    assert found == set()


def hidden_imports(m, tree, aliases):
    """runpy, importlib.import_module, __import__ or sys.modules used, or an imported project module
    passed as an argument."""
    found = []
    for n in ast.walk(tree):
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in n.names] + [getattr(n, "module", None) or ""]
            if any(x.split(".")[0] == "runpy" for x in names):
                found.append(f"{m}:{n.lineno} imports runpy")
            if getattr(n, "module", None) == "sys" and "modules" in [a.name for a in n.names]:
                found.append(f"{m}:{n.lineno} imports sys.modules")
        # a module looked up in sys.modules: a call no reader, grep or import graph sees
        if isinstance(n, ast.Attribute) and n.attr == "modules" and getattr(n.value, "id", None) == "sys":
            found.append(f"{m}:{n.lineno} reads sys.modules")
        if isinstance(n, ast.Call):  # find_spec (is a package installed?) reaches no module
            if getattr(n.func, "id", None) == "__import__" or \
                    getattr(n.func, "attr", None) == "import_module":
                found.append(f"{m}:{n.lineno} {ast.unparse(n.func)}")
            args = list(n.args) + [k.value for k in n.keywords]
            found += [f"{m}:{n.lineno} module {a.id} passed" for a in args
                      if isinstance(a, ast.Name) and a.id in aliases]
    return found


def test_no_module_is_reached_in_hiding():
    found = [line for m, tree in TREES.items() for line in hidden_imports(m, tree, imports(m)[0])]
    assert found == []


MODEL_NAMES = {"model", "m", "policy", "optimizer", "opt"}


def outside_state(m, tree):
    """Assignments to an attribute of a model or optimizer (model.amp = ..., optimizer.step = ...)."""
    found = []
    for n in ast.walk(tree):
        targets = n.targets if isinstance(n, ast.Assign) else \
            [n.target] if isinstance(n, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            for e in (t.elts if isinstance(t, ast.Tuple) else [t]):
                if not isinstance(e, ast.Attribute):
                    continue
                owner_ = e.value
                name = getattr(owner_, "id", None) or getattr(owner_, "attr", None)
                if name in MODEL_NAMES:
                    found.append(f"{m}:{n.lineno} {ast.unparse(e)} =")
    return found


def test_nothing_outside_model_and_lora_sets_a_model_or_optimizer_attribute():
    found = [line for m, tree in TREES.items() if m not in ("model", "lora")
             for line in outside_state(m, tree)]
    assert found == []


def changed_globals(tree):
    """Module-level names that a function of the module changes (global, item or method writes)."""
    top = {t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
           for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    changed = set()
    for f in ast.walk(tree):
        if not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for n in ast.walk(f):
            if isinstance(n, ast.Global):
                changed |= set(n.names) & top
            targets = n.targets if isinstance(n, ast.Assign) else \
                [n.target] if isinstance(n, ast.AugAssign) else []
            for t in targets:
                if isinstance(t, ast.Subscript) and getattr(t.value, "id", None) in top:
                    changed.add(t.value.id)
            mutators = ("append", "update", "clear", "pop", "extend", "add", "setdefault")
            if isinstance(n, ast.Call) and getattr(n.func, "attr", None) in mutators:
                name = getattr(n.func.value, "id", None)
                if name in top:
                    changed.add(name)
    return changed


def test_the_ground_floor_keeps_no_run_state_in_its_modules():
    assert {m: changed_globals(TREES[m]) for m in GROUND if changed_globals(TREES[m])} == {}


@pytest.mark.parametrize("code, kind", [
    ("import runpy\nrunpy.run_module('analysis.attribute')", hidden_imports),
    ("import train_base\nensure(train_base)", hidden_imports),
    ("import importlib\nimportlib.import_module('analysis.attribute')", hidden_imports),
    ("import sys\nd = sys.modules.get('scale.distributed')", hidden_imports),
    ("from sys import modules\nd = modules['scale.distributed']", hidden_imports),
    ("self.model.amp = amp", outside_state),
    ("optimizer.step = refuse", outside_state),
    ("TIMES = {}\ndef phase(name):\n    TIMES[name] = 1.0", changed_globals),
    ("COUNTS = {}\ndef reward(c):\n    COUNTS.clear()", changed_globals),
])
def test_each_structure_check_sees_what_it_rules_out(code, kind):
    """Each check finds the seam it rules out, written as the code once had it."""
    tree = ast.parse(code)
    found = kind(tree) if kind is changed_globals else \
        kind("snippet", tree, {"train_base": "train_base"}) if kind is hidden_imports else kind("snippet", tree)
    assert found
