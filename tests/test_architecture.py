"""The house keeps its shape (docs/architecture.md): each unit of the package stands on
the floor its imports give it and the page draws those floors, imports flow down them,
nothing imports the command line and no command another, no import circles, no private
name crosses a package, model files reach no fast-path kernel, importing a module only
imports and defines, the concept table names what its files define, and every module
without a test of its own is listed with the tests that cover it.

The imports are read with ``ast``, lazy ones inside functions included, so a circle that
Python would resolve at run time still counts.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parent.parent
ROOT = REPOSITORY / "src" / "qkv"
DOC = REPOSITORY / "docs" / "architecture.md"
TOP_LEVEL_FILES = {
    "__init__.py",
    "__main__.py",
    "errors.py",
    "files.py",
    "attention.py",
    "functional.py",
}
ROOF = ("qkv.cli", "qkv.__main__", "qkv")  # one unit: the command line and the public names
FAST_PATHS = ("qkv.kernels.matvec", "qkv.kernels.decode_layer", "qkv.kernels.layer_steps")
FAST_PATHS += ("qkv.kernels.cpu_flash",)


def _section(title: str) -> str:
    """The text of the section of docs/architecture.md headed ``## title``."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def _documented_floors() -> dict[str, int]:
    """``{unit: floor}`` from the block of docs/architecture.md's "The layers" (a unit is a
    top-level package or file: ``qkv.models``, ``qkv.functional``)."""
    block = _section("The layers").split("```text\n", 1)[1].split("```", 1)[0]
    floors = {}
    for line in block.splitlines():
        match = re.match(r"floor (\d+)\s+(.*)$", line)
        assert match, f"not a floor line in docs/architecture.md: {line!r}"
        for path in match.group(2).split():
            name = path.removeprefix("src/").rstrip("/").removesuffix(".py").replace("/", ".")
            floors["qkv" if name == "qkv.__init__" else name] = int(match.group(1))
    return floors


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


def _unit(module: str) -> str:
    """The top-level package or file a module belongs to (the roof's three are one)."""
    unit = ".".join(module.split(".")[:2])
    return "qkv.cli" if unit in ROOF else unit


def _unit_imports() -> dict[str, set[str]]:
    """``{unit: the other units it imports}``, lazy imports included."""
    graph: dict[str, set[str]] = {}
    for m in MODULES:
        targets = {_unit(t) for t, _, _ in _imports(m)} - {_unit(m)}
        graph.setdefault(_unit(m), set()).update(targets)
    return graph


def _floors() -> dict[str, int]:
    """Each unit's floor as the imports give it: one above the highest floor it imports."""
    graph, floors = _unit_imports(), {}

    def floor(unit: str, seen: tuple[str, ...] = ()) -> int:
        assert unit not in seen, f"an import circle: {' -> '.join((*seen, unit))}"
        if unit not in floors:
            floors[unit] = 1 + max((floor(t, (*seen, unit)) for t in graph[unit]), default=0)
        return floors[unit]

    for unit in graph:
        floor(unit)
    return floors


def test_the_documented_floors_are_those_the_imports_give():
    """docs/architecture.md draws the house as it is: every unit on the floor that its
    imports give it (the roof's three on the command line's)."""
    documented = _documented_floors()
    roof = documented.pop("qkv.__main__"), documented.pop("qkv")
    assert roof == (documented["qkv.cli"],) * 2
    assert documented == _floors()


def test_imports_flow_down_the_floors():
    """A module imports its own unit or the floors below; never another unit of its floor."""
    floors = _floors()
    sideways_or_up = [
        f"{m}:{line} imports {target} (floor {floors[_unit(target)]}, its own {floors[_unit(m)]})"
        for m in MODULES
        for target, _, line in _imports(m)
        if _unit(target) != _unit(m) and floors[_unit(target)] >= floors[_unit(m)]
    ]
    assert sideways_or_up == []


def test_no_command_module_imports_another():
    crossing = [
        f"{m}:{line} imports {target}"
        for m in MODULES
        if m.startswith("qkv.cli.")
        for target, _, line in _imports(m)
        if (target == "qkv.cli" or target.startswith("qkv.cli.")) and target != m
    ]
    assert crossing == []


def test_model_files_reach_no_fast_path_kernel():
    """The runners (qkv/engine/) hand a model to the C kernels; a model is its equations."""
    reaching = [
        f"{m}:{line} imports {target}" + (f".{name}" if name else "")
        for m in MODULES
        if m.startswith("qkv.models")
        for target, name, line in _imports(m)
        if target in FAST_PATHS or f"{target}.{name}" in FAST_PATHS
    ]
    assert reaching == []


def _defined(path: Path) -> set[str]:
    """The names a Python file defines at its top level and in its classes
    (``Class.method``); of a C file, the functions it defines."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".c":
        return set(re.findall(r"^\w[\w *]*?\b(\w+)\(", text, flags=re.MULTILINE))
    names = set()
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names |= {
                f"{node.name}.{item.name}"
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            }
        if isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _table(title: str, columns: int) -> list[list[str]]:
    """The rows of the table of a section of docs/architecture.md, as cell texts (the
    header left out)."""
    rows = []
    for line in _section(title).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == columns and not set(cells[0]) <= set("-"):
            rows.append(cells)
    return rows[1:]


def test_every_name_of_the_concept_table_is_in_its_file():
    rows = _table("Where each concept lives", 3)
    assert len(rows) >= 30
    missing = []
    for concept, file, names in rows:
        path = REPOSITORY / file.strip("`")
        assert path.is_file(), f"{concept}: no file {file}"
        defined = _defined(path)
        found = re.findall(r"`([\w.]+)`", names)
        assert found, f"{concept}: no names"
        missing += [f"{file}: {name}" for name in found if name not in defined]
    assert missing == []


def test_every_module_without_a_test_of_its_own_is_listed_with_its_tests():
    unmirrored = set()
    for path in MODULES.values():
        if path.name in ("__init__.py", "__main__.py"):
            continue
        relative = path.relative_to(ROOT)
        if not (REPOSITORY / "tests" / relative.parent / f"test_{path.stem}.py").is_file():
            unmirrored.add(f"src/qkv/{relative.as_posix()}")
    listed = {module.strip("`"): files for module, files in _table("Tests", 2)}
    assert set(listed) == unmirrored
    absent = [
        f"{module}: {name}"
        for module, files in listed.items()
        for name in re.findall(r"`([^`]+)`", files)
        if not (REPOSITORY / name).is_file()
    ]
    assert absent == []


def test_every_top_level_item_is_a_package_or_a_named_file():
    loose = sorted(
        p.name
        for p in ROOT.iterdir()
        if not p.name.startswith((".", "__pycache__"))
        and not (p.is_dir() and (p / "__init__.py").exists())
        and p.name not in TOP_LEVEL_FILES
    )
    assert loose == []


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
