"""The import structure stays as docs/architecture.md draws it: imports point down the layers, no two
packages import each other, and no two modules either (directly or around a circle). Every import counts:
type-only ones under ``TYPE_CHECKING``, lazy ones inside functions, and those of the package root (nothing
inside pitstop imports it). Read from the source with ``ast``: nothing runs."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

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
    "trace": 2,  # the trace engine: a profiler trace read into a rank's steps and what only a trace knows
    "core": 1,  # the core model: vocabulary (the words), profile (what was measured), findings
    "artifacts": 1,
    "frames": 1,  # the job's line behind an intercepted call (the probe's collectors, the trials' patches)  # opening artifacts safely, and IngestError (ingest and the trace engine)
    "hardware": 1,
    "ds_config": 1,
    "cpus": 1,
    "interconnect": 1,
    "clock_reasons": 1,
    "errors": 0,
    "schemas": 0,
    "atomic": 0,
    "regular": 0,
    "interrupts": 0,  # SIGTERM / SIGHUP raised as KeyboardInterrupt around a block (runner, attach)
    "version": 0,  # the version every document names (the package root re-exports it)
    "display": 0,  # the slot through which a result shows itself in a notebook (the root plugs the report in)
    "__init__": 8,  # the package's front door may point anywhere (lazily); nothing in the package imports it
}


def _modules() -> frozenset[str]:
    """The package's parts: its modules and subpackages (what ``pitstop.X`` can name as a module)."""
    return frozenset(
        p.name.removesuffix(".py") for p in SRC.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()
    ) - {"__init__"}


def _part(target: str, modules: frozenset[str]) -> str | None:
    """The part an import names: ``pitstop.diagnose.causes`` -> diagnose; the package root itself (``import
    pitstop``, or a name it defines: ``from pitstop import __version__``) -> __init__; outside pitstop -> None."""
    parts = target.split(".")
    if parts[0] != "pitstop":
        return None
    if len(parts) == 1 or parts[1] not in modules:
        return "__init__"
    return parts[1]


def imported(source: str) -> list[str]:
    """Every module ``source`` imports, wherever the import stands: at the top, inside a function, under
    ``if TYPE_CHECKING:`` (a type-only import is still a dependency between packages), or by
    ``importlib.import_module`` / ``__import__`` with a literal name. ``from a.b import c`` names ``a.b.c``:
    a module, or a name that ``a.b`` defines."""
    targets: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets += [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                targets.append(node.args[0].value)
    return targets


def imports_by_part() -> dict[tuple[str, str], list[str]]:
    """(importing part, imported part) -> the files where it happens."""
    modules = _modules()
    edges: dict[tuple[str, str], list[str]] = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC)
        here = rel.parts[0].removesuffix(".py")
        for target in imported(path.read_text()):
            there = _part(target, modules)
            if there and there != here and there in LAYERS:
                edges.setdefault((here, there), []).append(str(rel))
    return edges


def test_the_import_reader_sees_type_only_lazy_and_root_imports() -> None:
    source = textwrap.dedent(
        """
        from typing import TYPE_CHECKING
        import pitstop
        from pitstop import __version__, schemas
        if TYPE_CHECKING:
            from pitstop.remedies.base import Remedy
        def later():
            from pitstop.report.notebook import notebook_html
            return importlib.import_module("pitstop.tune.session")
        """
    )
    modules = frozenset({"schemas", "remedies", "report", "tune"})
    parts = [_part(t, modules) for t in imported(source)]
    assert parts == [None, "__init__", "__init__", "schemas", "remedies", "report", "tune"]
    assert _module_file("pitstop.tune.session.TuneResult") == SRC / "tune" / "session.py"
    assert _module_file("pitstop.report.html.svg") == SRC / "report" / "html" / "svg.py"
    assert _module_file("pitstop.report.html.render_html") == SRC / "report" / "html" / "__init__.py"
    assert _module_file("pitstop.trace._eventloop.scan") is None  # compiled: no source to read


def _module_file(target: str) -> Path | None:
    """The source file an import target runs: the module it names, else (``from m import name``) the module
    that defines the name; None outside the package or for a compiled module."""
    parts = target.split(".")
    if parts[0] != "pitstop":
        return None
    for whole in (parts, parts[:-1]):
        path = SRC.parent.joinpath(*whole)
        for candidate in (path.with_suffix(".py"), path / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def first_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """The first circle a depth-first walk of ``graph`` meets (its nodes, the first repeated at the end)."""
    state: dict[str, int] = {}  # 1: on the walk's trail, 2: done
    trail: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        trail.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*trail[trail.index(nxt) :], nxt]
            if state.get(nxt) is None and (loop := visit(nxt)) is not None:
                return loop
        trail.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (loop := visit(node)) is not None:
            return loop
    return None


def test_the_circle_search_finds_a_circle_and_only_one_that_is_there() -> None:
    assert first_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert first_circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_circle_between_modules() -> None:
    """Within a package too, no two modules import each other, directly or around a circle (type-only and
    lazy imports included): a circle means neither can be read, tested or moved without the other."""
    graph: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        for target in imported(path.read_text()):
            there = _module_file(target)
            if there is not None and there != path:
                graph.setdefault(str(path.relative_to(SRC)), set()).add(str(there.relative_to(SRC)))
    loop = first_circle(graph)
    assert loop is None, "circle: " + " -> ".join(loop or [])


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
        graph.setdefault(a, set()).add(b)
    loop = first_circle(graph)
    assert loop is None, "circle: " + " -> ".join(loop or [])


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
