"""The import structure stays as docs/architecture.md draws it: imports point down the layers, and no two
packages import each other (directly or around a circle). Read from the source with ``ast``: nothing runs."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "pitstop"

# higher imports lower; equal layers may import each other as long as no circle forms
LAYERS: dict[str, int] = {
    "cli": 7,
    "__main__": 7,
    "integrations": 7,  # in-process front doors (watch, callbacks): like the CLI, they measure and render
    "report": 6,
    "tune": 5,
    "history": 5,
    "runner": 4,
    "probe": 4,
    "attach": 4,  # pitstop attach: a running job sampled from outside (py-spy), into a RunProfile
    "ingest": 4,
    "wholerun": 4,  # whole-run windows, changes and stalls over the diagnose layer
    "demo": 4,
    "diagnose": 3,
    "plan": 3,
    "remedies": 3,
    "data": 3,
    "trials": 3,
    "findings": 1,
    "profile": 1,
    "catalogue": 1,
    "hardware": 1,
    "ds_config": 1,
    "cpus": 1,
    "interconnect": 1,
    "clock_reasons": 1,
    "vocabulary": 0,
    "errors": 0,
    "schemas": 0,
    "atomic": 0,
    "regular": 0,
    "__init__": 8,  # the package's front door may point anywhere (lazily)
}


def _part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "pitstop" and len(parts) > 1 else None


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports_by_part() -> dict[tuple[str, str], list[str]]:
    """(importing part, imported part) -> the files where it happens (type-only imports left out)."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC)
        here = rel.parts[0].removesuffix(".py")
        tree = ast.parse(path.read_text())
        skip = _type_checking_lines(tree)
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [
                    f"{node.module}.{a.name}" for a in node.names if node.module == "pitstop"
                ]
            for target in targets:
                there = _part(target)
                if there and there != here and there in LAYERS:
                    edges.setdefault((here, there), []).append(str(rel))
    return edges


def test_every_part_has_a_layer() -> None:
    parts = {p.relative_to(SRC).parts[0].removesuffix(".py") for p in SRC.glob("*") if p.name != "py.typed"}
    parts -= {"__pycache__"}
    assert parts <= set(LAYERS), f"give these a layer: {sorted(parts - set(LAYERS))}"


def test_imports_point_down() -> None:
    upward = [
        f"{a} (layer {LAYERS[a]}) imports {b} (layer {LAYERS[b]}) in {sorted(set(files))}"
        for (a, b), files in imports_by_part().items()
        if LAYERS[a] < LAYERS[b]
    ]
    assert not upward, "\n".join(upward)


def test_nothing_but_the_front_doors_imports_the_cli() -> None:
    into_cli = sorted({a for a, b in imports_by_part() if b == "cli" and a not in ("__main__", "__init__")})
    assert not into_cli, f"{into_cli} import the CLI"


def test_no_circle_between_packages() -> None:
    graph: dict[str, set[str]] = {}
    for a, b in imports_by_part():
        if a != "__init__":
            graph.setdefault(a, set()).add(b)
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                pytest.fail("circle: " + " -> ".join([*path[path.index(nxt) :], nxt]))
            if state.get(nxt) is None:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


MAX_FUNCTION_LINES = 80  # issue 11: a longer function is split into named helpers


def long_functions(source: str, name: str) -> list[str]:
    """Each function (or method, nested or not) of ``source`` longer than MAX_FUNCTION_LINES, from its
    ``def`` (decorators not counted) to its last line."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                out.append(f"{name}:{node.lineno} {node.name} ({length} lines)")
    return out


def test_the_length_check_sees_a_long_function() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES - 1))
    assert long_functions(f"def fits():\n{body}", "f.py") == []
    too_long = textwrap.indent(f"def long():\n{body}    y = 0\n", "        ")
    nested = f"class C:\n    def m(self):\n{too_long}"
    assert sorted(long_functions(nested, "f.py")) == ["f.py:2 m (82 lines)", "f.py:3 long (81 lines)"]


def test_no_function_is_longer_than_80_lines() -> None:
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 50  # the walk found the package
    offenders = [
        hit for path in files for hit in long_functions(path.read_text(), str(path.relative_to(SRC.parent)))
    ]
    assert not offenders, f"functions over {MAX_FUNCTION_LINES} lines (split them):\n" + "\n".join(offenders)
