"""The house keeps its shape (docs/architecture.md): imports flow down the layers, nothing
imports the command line, no import circles, no private name crosses a package, and
importing a module only imports and defines.

The imports are read with ``ast``, lazy ones inside functions included, so a circle that
Python would resolve at run time still counts.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "qkv"

# Lowest first. A module may import from its own layer and the layers below it.
LAYERS = [
    ["qkv.errors", "qkv.files"],
    ["qkv.attention"],
    ["qkv.kernels"],
    ["qkv.functional"],
    ["qkv.distributed"],
    ["qkv.modules"],
    ["qkv.data"],
    ["qkv.models"],
    ["qkv.translate"],
    ["qkv.train"],
    ["qkv.viz"],
    ["qkv.lab"],
    ["qkv.cli", "qkv.__main__", "qkv"],
]
TOP_LEVEL_FILES = {
    "__init__.py",
    "__main__.py",
    "errors.py",
    "files.py",
    "attention.py",
    "functional.py",
}


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _package(module: str) -> str:
    """The package a module's relative imports start from."""
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def _imports(module: str) -> list[tuple[str, str | None, int]]:
    """``(imported module, imported name or None, line)`` for every qkv import."""
    found = []
    for node in ast.walk(ast.parse(MODULES[module].read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names if a.name.startswith("qkv")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = _package(module).split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            if not base.startswith("qkv"):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in MODULES:  # a module: ``from qkv.lab import common``
                    found.append((sub, None, node.lineno))
                else:  # a name defined in the module ``base``
                    found.append((base, alias.name, node.lineno))
    return found


def _layer(module: str) -> int:
    best = None
    for rank, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > len(best[1]):
                    best = (rank, prefix)
    assert best is not None, f"{module} is in no layer of docs/architecture.md"
    return best[0]


def test_every_top_level_item_is_a_package_or_a_named_file():
    loose = sorted(
        p.name
        for p in ROOT.iterdir()
        if not p.name.startswith((".", "__pycache__"))
        and not (p.is_dir() and (p / "__init__.py").exists())
        and p.name not in TOP_LEVEL_FILES
    )
    assert loose == []


def test_imports_flow_down_the_layers():
    upward = [
        f"{m}:{line} imports {target} (layer {_layer(target)} above {_layer(m)})"
        for m in MODULES
        for target, _, line in _imports(m)
        if _layer(target) > _layer(m)
    ]
    assert upward == []


def test_nothing_imports_the_command_line():
    users = [
        f"{m}:{line}"
        for m in MODULES
        if m != "qkv.__main__" and not (m == "qkv.cli" or m.startswith("qkv.cli."))
        for target, _, line in _imports(m)
        if target == "qkv.cli" or target.startswith("qkv.cli.")
    ]
    assert users == []


def test_no_import_circles():
    graph = {m: {t for t, _, _ in _imports(m) if t in MODULES and t != m} for m in MODULES}
    circles, done, path = [], set(), []

    def visit(m: str) -> None:
        if m in path:
            circles.append(" -> ".join(path[path.index(m) :] + [m]))
            return
        if m in done:
            return
        path.append(m)
        for t in sorted(graph[m]):
            visit(t)
        path.pop()
        done.add(m)

    for m in sorted(graph):
        visit(m)
    assert circles == []


def test_no_private_name_crosses_a_package():
    crossing = [
        f"{m}:{line} takes {name} from {target}"
        for m in MODULES
        for target, name, line in _imports(m)
        if (name or target.rpartition(".")[2]).startswith("_")
        and not (name or target).startswith("__")
        and _package(m) != (target.rpartition(".")[0] if name is None else _package(target))
    ]
    assert crossing == []


DEFINES = (
    ast.Import,
    ast.ImportFrom,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Assign,
    ast.AnnAssign,
    ast.AugAssign,
)


@pytest.mark.parametrize("module", [m for m in MODULES if m != "qkv.__main__"])
def test_importing_a_module_only_imports_and_defines(module):
    body = ast.parse(MODULES[module].read_text(encoding="utf-8")).body
    doings = [
        f"line {node.lineno}: {ast.unparse(node).splitlines()[0]}"
        for node in body
        if not isinstance(node, DEFINES)
        and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
        and not (isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test))
    ]
    assert doings == []
