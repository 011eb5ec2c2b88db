"""The layer contract of docs/ARCHITECTURE.md, checked over the real import graph of brorl_lab/.

core -> {theory, rollout} -> rl -> lab -> study -> cli: a module imports its own layer or a layer below, never above, never
the sibling layer; no imports form a cycle (function-level ones included). Every import counts, wherever it is written: at
module level,
inside a function (a lazy import is still a dependency), and as an import string (``"brorl_lab.rl.algo:ADVANTAGES"``
handed to importlib or a registry), which is how a lower layer could otherwise reach up unseen. The checker is itself
tested on injected upward imports of each kind.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "brorl_lab"
RANK = {"core": 0, "theory": 1, "rollout": 1, "rl": 2, "lab": 3, "study": 4, "cli": 5}
ROOT = "brorl_lab"  # the composition root (brorl_lab/__init__.py): above every layer, imports lazily
IMPORT_STRING = re.compile(r"^(brorl_lab(?:\.\w+)+)(?::\w+)?$")  # "brorl_lab.rl.algo" or "brorl_lab.rl.algo:ADVANTAGES"


def is_module(name: str) -> bool:
    path = PACKAGE.parent / name.replace(".", "/")
    return path.with_suffix(".py").exists() or path.is_dir()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    return ("cli" if parts[1] == "__main__" else parts[1]) if len(parts) > 1 else ROOT


def imports_of(module: str, source: str, is_package: bool) -> list[tuple[str, int, bool]]:
    """``(imported module, line, at module level)`` for every brorl_lab import in ``source``: import statements at
    any depth, and string constants naming a brorl_lab module (import strings; never module level)."""
    tree = ast.parse(source)
    top = {id(n) for n in tree.body}
    for n in tree.body:  # `if TYPE_CHECKING:` / try blocks at module level still run at import
        if isinstance(n, (ast.If, ast.Try)):
            top |= {id(c) for c in ast.walk(n)}
    package = module if is_package else module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import sub` imports the submodule when one exists
            names = [f"{base}.{a.name}" if is_module(f"{base}.{a.name}") else base for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and IMPORT_STRING.match(node.value):
            module = IMPORT_STRING.match(node.value).group(1)
            if is_module(module):
                out.append((module, node.lineno, False))
            continue
        else:
            continue
        out += [(n, node.lineno, id(node) in top) for n in names if n == ROOT or n.startswith(ROOT + ".")]
    return out


def violations(graph: dict[str, list[tuple[str, int, bool]]]) -> list[str]:  # noqa: C901 - the layer rule and the cycle search, one checker read whole
    """Every import that runs upward or sideways, and every cycle among module-level imports."""
    bad = []
    for mod, deps in graph.items():
        src = layer_of(mod)
        for dep, line, _ in deps:
            dst = layer_of(dep)
            if src == ROOT or dst == src:
                continue
            if dst == ROOT:
                bad.append(f"{mod}:{line} imports the package root {dep} (import the defining module instead)")
            elif RANK[dst] >= RANK[src]:
                bad.append(f"{mod}:{line} imports {dep}: layer '{src}' may not import layer '{dst}'")
    # Cycles count every import, module-level or inside a function (a lazy import only hides a cycle). A package
    # naming its own submodules (a registry's import strings in __init__) is the package, not a cycle: a submodule's
    # import runs its parent package first anyway.
    edges = {m: {d for d, _, _ in deps if d in graph and d != m and not d.startswith(m + ".")}
             for m, deps in graph.items()}
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in sorted(edges[m]):
            if state.get(d) == 1:
                cyc = stack[stack.index(d):] + [d] if d in stack else [m, d]
                bad.append("import cycle: " + " -> ".join(cyc))
            elif d not in state:
                visit(d, stack + [d])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    return bad


def package_graph() -> dict[str, list[tuple[str, int, bool]]]:
    files = sorted(PACKAGE.rglob("*.py"))
    return {module_name(f): imports_of(module_name(f), f.read_text(encoding="utf-8"), f.name == "__init__.py")
            for f in files}


def with_injected(module: str, source: str) -> dict[str, list[tuple[str, int, bool]]]:
    """The package's import graph with ``source``'s imports added to ``module`` (as lazy imports)."""
    graph = package_graph()
    graph[module] = graph[module] + imports_of(module, source, False)
    return graph


def test_every_module_sits_in_a_layer():
    graph = package_graph()
    assert {layer_of(m) for m in graph} == set(RANK) | {ROOT}
    assert len(graph) > 30


def test_no_import_runs_upward_or_in_a_circle():
    assert violations(package_graph()) == []


@pytest.mark.parametrize("module, source, needle", [
    ("brorl_lab.core.config", "def f():\n    from brorl_lab.rl import algo\n", "layer 'core' may not import layer 'rl'"),
    ("brorl_lab.core.config", "class C:\n    def f(self):\n        import brorl_lab.rollout.tasks\n",
     "layer 'core' may not import layer 'rollout'"),
    ("brorl_lab.core.registry", "KINDS = {'advantage': 'brorl_lab.rl.algo:ADVANTAGES'}\n",
     "layer 'core' may not import layer 'rl'"),
    ("brorl_lab.core.config", "import importlib\ndef f():\n    importlib.import_module('brorl_lab.rl.trackers')\n",
     "layer 'core' may not import layer 'rl'"),
    ("brorl_lab.rollout.rewards", "from brorl_lab.theory import softmax\n", "layer 'rollout' may not import layer 'theory'"),
    ("brorl_lab.rl.steps", "from ..lab import plots\n", "layer 'rl' may not import layer 'lab'"),
    ("brorl_lab.lab.plots", "def f():\n    from brorl_lab.study import mechanism\n", "layer 'lab' may not import layer 'study'"),
    ("brorl_lab.lab.plots", "import brorl_lab\n", "imports the package root"),
    # the study's own order (study_order_violations, below)
    ("brorl_lab.study.recipe", "def f():\n    from brorl_lab.study import arms\n", "recipe imports study.arms"),
    ("brorl_lab.study.arms", "from brorl_lab.study.plateau import plateau_config\n", "study.arms imports study.plateau"),
    ("brorl_lab.study.theorem", "from brorl_lab.study.plateau import PLATEAU_RULE\n", "only its own users"),
])
def test_the_checker_catches_an_injected_upward_import(module, source, needle):
    graph = with_injected(module, source)
    found = violations(graph) + study_order_violations(graph)
    assert any(needle in v for v in found), found


@pytest.mark.parametrize("top", [True, False], ids=["module-level", "inside-a-function"])
def test_the_checker_catches_a_cycle(top):
    graph = package_graph()
    graph["brorl_lab.core.batch"] = graph["brorl_lab.core.batch"] + [("brorl_lab.core.config", 1, True)]
    graph["brorl_lab.core.config"] = graph["brorl_lab.core.config"] + [("brorl_lab.core.batch", 1, top)]
    assert any(v.startswith("import cycle") for v in violations(graph))


def test_importing_and_building_a_config_imports_no_torch():
    """Config is plain data: importing it and building one (with user-named tasks and a bad registry name, which
    only rl.spec.resolve looks up) loads nothing above core, and so no torch."""
    code = ("import sys; from brorl_lab.core.config import Config; "
            "Config(tasks=['rg:basic_arithmetic'], engine='no_such_engine', report_to=['x']); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('brorl_lab.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert eval(out) == ["brorl_lab.core", "brorl_lab.core.config", "brorl_lab.core.trl_names",
                         "brorl_lab.core.validation"]


MACHINE_PATHS = ("/work/", "/root/", "/home/", "/Users/", "/tmp/bash_jobs")


def test_no_tracked_file_names_a_path_of_the_build_machine():
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    hits = []
    for name in files:
        path = REPO / name
        if path.suffix in (".safetensors", ".parquet", ".png") or not path.is_file() or name == "tests/test_architecture.py":
            continue
        text = path.read_text(encoding="utf-8", errors="ignore")
        hits += [f"{name}: {p}" for p in MACHINE_PATHS if p in text]
    assert hits == []


# ---- the study's own order (brorl_lab/study/__init__.py is its map) ----------------------------------------------------
# Each study module may import only the study modules before it here: the recipe is the base, the plateau sits above
# what it uses and below nothing but the CLI, the verdict lives in revival alone.
STUDY_ORDER = ("results", "recipe", "rare", "compare", "mechanism", "plateau", "arms", "paid", "revival", "ablations",
               "runner", "regime", "theorem", "frontier",
               "allocation", "render")  # regime and theorem run on the runner's machinery; render reads every study


def study_imports(graph) -> dict[str, set[str]]:
    """{study module: the study modules it imports} (short names, every import counted, lazy ones too)."""
    out = {}
    for mod, deps in graph.items():
        if mod.startswith("brorl_lab.study.") and mod.count(".") == 2:
            out[mod.split(".")[2]] = {d.split(".")[2] for d, _, _ in deps
                                      if d.startswith("brorl_lab.study.") and d.count(".") == 2} - {mod.split(".")[2]}
    return out


def study_order_violations(graph) -> list[str]:
    bad = []
    for mod, deps in study_imports(graph).items():
        if mod not in STUDY_ORDER:
            bad.append(f"brorl_lab.study.{mod} is not in STUDY_ORDER (add it to the map in study/__init__.py too)")
            continue
        bad += [f"brorl_lab.study.{mod} imports study.{d}, which comes after it (or is unknown)"
                for d in sorted(deps) if d not in STUDY_ORDER[:STUDY_ORDER.index(mod)]]
    users = sorted(m for m, deps in graph.items() for d, _, _ in deps
                   if d == "brorl_lab.study.plateau" and m != "brorl_lab.study.plateau")
    bad += [f"{m} imports study.plateau; only its own users (the CLI) may" for m in users if m != "brorl_lab.cli"]
    return bad


def test_the_study_keeps_its_order():
    graph = package_graph()
    assert set(study_imports(graph)) == set(STUDY_ORDER)  # the map and the modules agree
    assert study_order_violations(graph) == []
    init = (PACKAGE / "study" / "__init__.py").read_text()
    assert all(f"\n    {m} " in init for m in STUDY_ORDER)  # the package docstring maps every module


def test_the_verdict_lives_in_one_place():
    """One verdict: brorl_revives (the rule fixed before the run) is defined in study/revival.py only, and no other
    module of the package defines a function called a verdict."""
    defined = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                    "verdict" in node.name or "revive" in node.name):
                defined.setdefault(node.name, []).append(module_name(f))
    assert defined == {"brorl_revives": ["brorl_lab.study.revival"]}, defined


# ---- one name and one source for N (issue 42) ------------------------------------------------------------------------
# An arm's N is `rollouts_per_prompt` and its prompts per step `prompts_per_step` (an arm table maps arm -> both:
# study.recipe.ARM_TABLE, the one place the study writes them); `draws` counts samples drawn to measure a pass rate.
OLD_NAMES = re.compile(r"\b(n_small|n_large|n_mid|prompts_small|prompts_large|prompts_mid|n_draws)\b|\bN(16|512)\b")
N_LITERALS = (16, 512)
N_LITERAL_TEXT = re.compile(r"(?<![\d./])(16|512)(?!\d)")  # in a string: "N=512", "E[s_16]"; not "1/16"
NOT_AN_N = "# not an N:"  # a line whose 16 is some other count (a chunk of prompts), saying which
# Where an old name may still be read, so callers not yet moved keep working: the translation tables and the
# function that reads them.
LEGACY_SHIMS = {"LEGACY_ARM_OPTIONS", "LEGACY_NAMES", "legacy_arm_table"}
# Study modules not yet moved to arm tables, each with why; the test checks each still needs its entry.
PENDING_N = {
    "paid.py": "the lead is generalizing it to per-arm configs (issue 42): arm_options' n_small, ... and n_draws",
    "runner.py": "the lead is generalizing it to per-arm configs (issue 42): run_floor's n_small, literals",
    "frontier.py": ("its arms come from the recipe's table; what is left: 16 as a round cap and as a batch of groups, "
                    "and the committed declaration's text naming arm n512x16 (changing it would change the declaration)"),
    "render.py": "reads the shipped files' columns named by N (E_s16, ds_512): renaming them needs a re-ship",
}


def _n_offences(path: Path, *, literals: bool = True) -> list[str]:
    """Every literal 16 / 512 (unless ``literals`` is False) and every old name of N in ``path``'s code: numbers,
    identifiers and strings (not docstrings, not a line marked NOT_AN_N, not inside LEGACY_SHIMS)."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    tree = ast.parse(source)
    docs, shim = set(), set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(
                getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            docs.add(id(body[0].value))
        named = {t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)} | {getattr(node, "name", "")}
        if named & LEGACY_SHIMS:
            shim |= {id(n) for n in ast.walk(node)}
    out = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if id(node) in shim or id(node) in docs or (line and NOT_AN_N in lines[line - 1]):
            continue
        names = [getattr(node, k) for k in ("id", "arg", "attr") if isinstance(getattr(node, k, None), str)]
        if literals and isinstance(node, ast.Constant) and type(node.value) in (int, float) and node.value in N_LITERALS:
            out.append(f"{path.name}:{line}: literal {node.value}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if (literals and N_LITERAL_TEXT.search(node.value)) or OLD_NAMES.search(node.value):
                out.append(f"{path.name}:{line}: {node.value!r}")
        out += [f"{path.name}:{line}: old name {n}" for n in names if OLD_NAMES.fullmatch(n)]
    return out


def test_study_code_writes_no_n_but_the_recipes_and_uses_one_name_for_it():
    """No study module but the recipe writes 16 or 512 (an arm's N and the paper's constants live in
    study.recipe), and none uses the old names of N (n_small, prompts_large, n_draws, ...)."""
    study = sorted((PACKAGE / "study").glob("*.py"))
    offences = {p.name: _n_offences(p, literals=p.name != "recipe.py") for p in study}
    assert {name: found for name, found in offences.items() if found and name not in PENDING_N} == {}
    assert [name for name in PENDING_N if not offences.get(name)] == []  # a module moved leaves PENDING_N


def test_the_notebooks_and_the_cli_use_the_study_names_of_n():
    files = [*sorted((REPO / "notebooks").glob("*.py")), PACKAGE / "cli.py"]
    hits = [f"{p.name}:{i}: {line.strip()}" for p in files
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if OLD_NAMES.search(line)]
    assert hits == []


def test_the_n_checker_catches_a_literal_an_old_name_and_an_n_in_a_string(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('"""N = 16 in a docstring is prose."""\nN = 512\ndef f(n_small=2):\n    return "only N=16"\n'
                   'CHUNK = 16  # not an N: prompts per chunk\nLEGACY_NAMES = {"n_draws": "draws"}\n')
    assert sorted(_n_offences(bad)) == ["bad.py:2: literal 512", "bad.py:3: old name n_small", "bad.py:4: 'only N=16'"]
