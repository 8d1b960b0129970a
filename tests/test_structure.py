# The code a reader opens is the code that runs: checked on the source itself (ast), every non-test file.
#   - no function of another project module, no model's forward / new_cache, is replaced at run time
#     (an attribute of an imported project module assigned, setattr on a module, functools.wraps used to
#     rebind a name): every seam is a call in sight;
#   - imports flow one way: no import cycle among the project's modules (every import statement counts,
#     inside functions too), and scale/ (primitives) imports no step file;
#   - each top-level file keeps at most 5 % of its lines over 100 characters.
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


def test_scale_holds_primitives_and_imports_no_step_file():
    down = {(m, t) for m in MODULES if m.startswith("scale") for t in imports(m)[1] if t in STEP_FILES}
    assert down == set()


TOP_LEVEL = sorted(m for m, p in MODULES.items() if os.path.dirname(p) == ROOT)  # the lecture's files


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_top_level_lines_are_read_at_a_glance(name):
    lines = open(MODULES[name], encoding="utf-8").read().splitlines()
    long = [i + 1 for i, line in enumerate(lines) if len(line) > 100]
    assert len(long) <= 0.05 * len(lines), f"{name}.py: {len(long)} of {len(lines)} lines over 100: {long[:10]}"
