"""The package graph points one way: every plelab import goes down a floor (docs/architecture.md), and no modules
import each other in a circle. No exceptions: a new import that points up fails here, and so does a new package
until it is given a floor.

Every import counts for the floors, wherever it is written (module level, inside a function, under
TYPE_CHECKING): a lazy import is still a dependency. Cycles are looked for among the imports that run, so an
import under `if TYPE_CHECKING:` (only a type checker reads it) is left out of that check.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "plelab"

FLOORS: dict[str, int] = {
    # 0: the package's name and version, the one error type
    "plelab": 0, "errors": 0,
    # 1: helpers that know nothing of models: files, typed configs, device and precision choice; statistics
    "util": 1, "stats": 1,
    # 2: what a model is made of and what it reads
    "data": 2, "model": 2,
    # 3: run folders: the lock, the recorded config, checkpoints, metrics
    "runs": 3,
    # 4: using a trained model: loading, evaluation, generation
    "inference": 4,
    # 5: is PLE alive? (measurements on a model and batches)
    "diagnostics": 5,
    # 6: training a model; shipping it to small devices
    "training": 6, "edge": 6,
    # 7: training on several processes (applies itself through training.distribution)
    "parallel": 7,
    # 8: Hugging Face / Gemma checkpoints; the visual PLE plug-in
    "hf": 8, "vision": 8,
    # 9: the sweep engine: sweeps, analysis plans, records, the demo (knows no study)
    "experiments": 9,
    # 10: the studies, one package each, and the registry `plelab report` reads
    "studies": 10,
    # 11: the command line, and `python -m plelab`
    "cli": 11, "__main__": 12,
}
"""Floor of each top-level package or module of plelab: an import may only point to a lower floor (or stay
inside its own package). Keep docs/architecture.md in step with this table."""


def module_name(path: Path) -> str:
    """plelab.x.y for plelab/x/y.py (and plelab.x for plelab/x/__init__.py)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(path: Path, modules: set[str]) -> list[tuple[str, int, bool]]:
    """(imported plelab module, line, runs at import time or in a call) for every import in the file."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, int, bool]] = []

    def resolve(dotted: str) -> str:
        while dotted not in modules and "." in dotted:
            dotted = dotted.rpartition(".")[0]
        return dotted

    def visit(node: ast.AST, runs: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, False)
            for child in node.orelse:
                visit(child, runs)
            return
        if isinstance(node, ast.Import):
            found.extend((resolve(a.name), node.lineno, runs) for a in node.names if a.name.split(".")[0] == "plelab")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            if base.split(".")[0] == "plelab":
                for alias in node.names:  # `from plelab.x import y` imports the module plelab.x.y when there is one
                    full = f"{base}.{alias.name}"
                    found.append((full if full in modules else resolve(base), node.lineno, runs))
        for child in ast.iter_child_nodes(node):
            visit(child, runs)

    visit(ast.parse(path.read_text(encoding="utf-8")), True)
    return found


def top(module: str) -> str:
    """The floor key of a module: its top-level package or module under plelab ("plelab" for plelab itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "plelab"


def graph() -> tuple[dict[str, list[tuple[str, int, bool]]], set[str]]:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(f) for f in files}
    return {module_name(f): imports(f, modules) for f in files}, modules


def test_every_package_has_a_floor():
    _, modules = graph()
    missing = sorted({top(m) for m in modules} - set(FLOORS))
    assert not missing, f"give these a floor in FLOORS (and docs/architecture.md): {missing}"


def test_every_import_points_down_a_floor():
    edges, _ = graph()
    upward = [f"{src}:{line} imports {dst} (floor {FLOORS[top(src)]} -> {FLOORS[top(dst)]})"
              for src, found in edges.items() for dst, line, _ in found
              if top(src) != top(dst) and FLOORS[top(dst)] >= FLOORS[top(src)]]
    assert not upward, "imports that do not point to a lower floor:\n" + "\n".join(upward)


def test_no_modules_import_each_other_in_a_circle():
    edges, modules = graph()
    runtime = defaultdict(set)
    for src, found in edges.items():
        runtime[src].update(dst for dst, _, runs in found if runs and dst != src)
    # Tarjan's strongly connected components: any component of two or more modules is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in runtime[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(modules):
        if module not in index:
            connect(module)
    assert not cycles, "modules that import each other in a circle: " + "; ".join(", ".join(c) for c in cycles)


STUDY_BUILDS_ON = {"law": {"deadzone"}, "tokens": {"deadzone"}}
"""The studies a study package may import: the dead-zone law and the tokens study extend the dead-zone analysis.
Below the command line, only plelab.studies.registry, which lists every study, imports them freely: the engine
(plelab.experiments) and the studies' shared modules (plelab.studies.review) import none."""


def study_of(module: str) -> str | None:
    """The study package a module belongs to (plelab.studies.law.report -> "law"); None outside one."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "studies" and (PACKAGE / "studies" / parts[2]).is_dir() \
        else None


def test_the_engine_imports_no_study_and_a_study_only_what_it_builds_on():
    edges, _ = graph()
    wrong = []
    for src, found in edges.items():
        for dst, line, _ in found:
            theirs, ours = study_of(dst), study_of(src)
            if theirs is None or theirs == ours or src == "plelab.studies.registry" or \
                    top(src) not in ("experiments", "studies"):  # the command line above may use any study
                continue
            if ours is None:
                wrong.append(f"{src}:{line} imports the {theirs} study ({dst}): only the registry may")
            elif theirs not in STUDY_BUILDS_ON.get(ours, set()):
                wrong.append(f"{src}:{line}: the {ours} study imports the {theirs} study ({dst}), which it does not "
                             "build on (STUDY_BUILDS_ON)")
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_what_it_should(tmp_path):
    """The parser on a constructed file: relative, lazy and TYPE_CHECKING imports, `from package import module`."""
    pkg = tmp_path / "plelab" / "a"
    pkg.mkdir(parents=True)
    src = pkg / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nfrom . import n\nfrom plelab.b.c import f\n"
                   "if TYPE_CHECKING:\n    from plelab.d import g\n"
                   "def h():\n    import plelab.e.k\n")
    modules = {"plelab.a.m", "plelab.a.n", "plelab.b.c", "plelab.d", "plelab.e.k"}
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path / "plelab"
    try:
        found = imports(src, modules)
    finally:
        PACKAGE = saved
    assert found == [("plelab.a.n", 2, True), ("plelab.b.c", 3, True), ("plelab.d", 5, False),
                     ("plelab.e.k", 7, True)]
