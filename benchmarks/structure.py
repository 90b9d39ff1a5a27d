"""The structure's figures: what a maintainer meets, measured from the source (no import, no run).

    python benchmarks/structure.py [--json] [ROOT]

Prints, for the engine (``optimizer/``) and the TUI (``tui/``): the largest modules and classes
(lines, methods), functions with more than 8 and more than 12 parameters (``self``/``cls`` not
counted), branches on a policy's name outside the policies' module, imports of another module's
underscore names, public functions that return ``dict[str, Any]``, modules at ``optimizer/``'s root,
import cycles between project modules (function-level imports included), and the files ``ruff format``
would change. Compare two checkouts by running it in each (the figures of the rooms issue).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

TREES = ("optimizer", "tui")
# A branch on a policy's name: `policy == "adaptive"`, `self.policy in ("paired", ...)`, `.policy != ...`.
POLICY_BRANCH = re.compile(r"\bpolicy\b\s*(==|!=|\bin\b|\bnot in\b)\s*[\"'(\[{A-Z]")
POLICY_MODULES = ("optimizer/stats/policies", "optimizer/policies", "optimizer/loop/policies")


@dataclass
class Figures:
    largest_modules: list[tuple[str, int]] = field(default_factory=list)
    largest_classes: list[tuple[str, int, int]] = field(default_factory=list)
    functions_over_8_params: int = 0
    functions_over_12_params: int = 0
    policy_branches_outside_policies: int = 0
    underscore_imports_across_modules: int = 0
    public_functions_returning_dict_any: int = 0
    modules_at_optimizer_root: int = 0
    import_cycles: list[list[str]] = field(default_factory=list)
    files_ruff_format_would_change: int | None = None


def _py_files(root: Path) -> Iterator[Path]:
    for tree in TREES:
        yield from sorted((root / tree).rglob("*.py"))


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [p.arg for p in (a.vararg, a.kwarg) if p is not None]
    return len([n for n in names if n not in ("self", "cls")])


def _imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[str, list[str]]]:
    """(imported module, names) for every import in ``tree``, relative ones resolved."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module.split(".") if is_package else module.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join([*pkg, base] if base else pkg)
            yield base, [alias.name for alias in node.names]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def import_cycles(root: Path) -> list[list[str]]:
    """The import cycles between project modules under ``root`` (the structure gate's own test asks for none)."""
    return measure(root, ruff=False).import_cycles


def measure(root: Path, *, ruff: bool = True) -> Figures:
    figs = Figures()
    modules: dict[str, tuple[Path, ast.Module]] = {}
    for path in _py_files(root):
        modules[_module_name(root, path)] = (path, ast.parse(path.read_text(encoding="utf-8")))
    sizes = []
    classes = []
    graph: dict[str, set[str]] = {}
    for name, (path, tree) in modules.items():
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        sizes.append((rel, len(text.splitlines())))
        if not rel.startswith(POLICY_MODULES):
            figs.policy_branches_outside_policies += len(POLICY_BRANCH.findall(text))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                methods = sum(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in node.body)
                classes.append(
                    (f"{rel}:{node.name}", (node.end_lineno or node.lineno) - node.lineno + 1, methods)
                )
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = _params(node)
                figs.functions_over_8_params += n > 8
                figs.functions_over_12_params += n > 12
        for node in _public_functions(tree):
            if node.returns is not None and ast.unparse(node.returns).replace(" ", "") == "dict[str,Any]":
                figs.public_functions_returning_dict_any += 1
        is_package = path.name == "__init__.py"
        edges = graph.setdefault(name, set())
        for target, names in _imports(tree, name, is_package):
            if not target.startswith(TREES):
                continue
            for imported in names or [""]:
                sub = f"{target}.{imported}" if imported else target
                dest = sub if sub in modules else target
                if dest in modules and dest != name:
                    edges.add(dest)
                if (
                    imported.startswith("_")
                    and not imported.startswith("__")
                    and sub not in modules
                    and target != name
                ):
                    figs.underscore_imports_across_modules += 1
    figs.largest_modules = sorted(sizes, key=lambda s: -s[1])[:5]
    figs.largest_classes = sorted(classes, key=lambda c: -c[1])[:5]
    figs.modules_at_optimizer_root = sum(
        1 for p in (root / "optimizer").glob("*.py") if p.name != "__init__.py"
    )
    # Import cycles among modules (a package's __init__ is left out: importing a submodule runs it).
    figs.import_cycles = _cycles(
        {
            m: {d for d in e if not _is_package(modules, d)}
            for m, e in graph.items()
            if not _is_package(modules, m)
        }
    )
    figs.files_ruff_format_would_change = _ruff_format_changes(root) if ruff else None
    return figs


def _public_functions(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Module-level functions and methods of module-level classes whose names are public."""
    for node in tree.body:
        inner = node.body if isinstance(node, ast.ClassDef) and not node.name.startswith("_") else [node]
        for fn in inner:
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and not fn.name.startswith("_"):
                yield fn


def _is_package(modules: dict[str, tuple[Path, ast.Module]], name: str) -> bool:
    return modules[name][0].name == "__init__.py"


def _ruff_format_changes(root: Path) -> int | None:
    ruff = Path(sys.executable).parent / "ruff"
    try:
        proc = subprocess.run(
            [str(ruff), "format", "--check", "."], cwd=root, capture_output=True, text=True, check=False
        )
    except OSError:
        return None
    found = re.search(r"(\d+) files? would be reformatted", proc.stdout + proc.stderr)
    return int(found.group(1)) if found else 0


def main(argv: list[str]) -> int:
    as_json = "--json" in argv
    rest = [a for a in argv if a != "--json"]
    root = Path(rest[0]) if rest else Path(__file__).resolve().parent.parent
    figs = measure(root)
    if as_json:
        print(json.dumps(asdict(figs)))
        return 0
    print(f"structure of {root}")
    print("largest modules:        " + ", ".join(f"{p} {n}" for p, n in figs.largest_modules))
    print(
        "largest classes:        "
        + ", ".join(f"{c} {n} lines/{m} methods" for c, n, m in figs.largest_classes[:3])
    )
    print(f"functions > 8 params:   {figs.functions_over_8_params}")
    print(f"functions > 12 params:  {figs.functions_over_12_params}")
    print(f"policy branches outside the policies' module: {figs.policy_branches_outside_policies}")
    print(f"underscore imports across modules: {figs.underscore_imports_across_modules}")
    print(f"public functions returning dict[str, Any]: {figs.public_functions_returning_dict_any}")
    print(f"modules at optimizer/'s root: {figs.modules_at_optimizer_root}")
    print(
        f"import cycles:          {len(figs.import_cycles)} "
        + "; ".join(" <-> ".join(c) for c in figs.import_cycles)
    )
    print(f"files ruff format would change: {figs.files_ruff_format_would_change}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
