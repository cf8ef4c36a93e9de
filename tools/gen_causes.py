"""Write docs/causes.md from the code that decides: each cause's module (``src/pitstop/diagnose/causes/``:
its id, title, GPU-only or not, prose, remedies and rule) and the module's constants (its thresholds and
assumptions), so the page cannot drift from what pitstop does.

    python tools/gen_causes.py           # rewrite docs/causes.md
    python tools/gen_causes.py --check   # exit 1 when docs/causes.md is stale (tests/unit/test_docs.py)

The prose under "fires when" and "estimate" is the cause's own (``@cause(fires_when=..., estimate=...)``); its
thresholds are the module's constants filled in (``{DATA_WAIT_MIN:.0%}``), so a changed constant changes the
page.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "causes.md"
COMMAND = "python tools/gen_causes.py"


@dataclass(frozen=True)
class Constant:
    name: str
    source: str  # the value as written in the module
    comment: str


def _module_constants(module: ModuleType) -> dict[str, Constant]:
    """Module-level UPPER_CASE assignments with literal values, as written, with their line comments."""
    text = inspect.getsource(module)
    lines = text.splitlines()
    found: dict[str, Constant] = {}
    for node in ast.parse(text).body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(node, ast.AnnAssign):
            target = node.target
        value = getattr(node, "value", None)
        if not isinstance(target, ast.Name) or not target.id.isupper() or value is None:
            continue
        try:
            ast.literal_eval(value)
            source = " ".join((ast.get_source_segment(text, value) or "").split())
        except ValueError:
            if not isinstance(value, ast.Name):  # a name for a number defined elsewhere: its value
                continue
            source = repr(getattr(module, target.id))
        last = lines[(node.end_lineno or node.lineno) - 1]
        comment = last.split("  # ", 1)[1].strip() if "  # " in last else ""
        found[target.id] = Constant(target.id, source, comment)
    return found


def _functions(module: ModuleType) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(inspect.getsource(module))
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _reached(name: str, functions: dict[str, ast.FunctionDef]) -> list[ast.FunctionDef]:
    """The rule's function and every function of its module it calls, directly or through others."""
    seen: dict[str, ast.FunctionDef] = {}
    todo = [name]
    while todo:
        current = todo.pop()
        if current in seen or current not in functions:
            continue
        seen[current] = functions[current]
        todo.extend(n.id for n in ast.walk(functions[current]) if isinstance(n, ast.Name))
    return list(seen.values())


def _names(nodes: Iterable[ast.AST]) -> set[str]:
    return {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name)}


def _remedies(nodes: Iterable[ast.AST]) -> list[str]:
    """The remedies the code names (``RemedyId.X``)."""
    from pitstop.core.vocabulary import RemedyId

    found = {
        str(getattr(RemedyId, n.attr))
        for node in nodes
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and n.value.id == "RemedyId"
        and hasattr(RemedyId, n.attr)
    }
    return sorted(found)


def _fill(template: str, constants: dict[str, Constant]) -> str:
    values: dict[str, Any] = {c.name: ast.literal_eval(c.source.replace("_", "")) for c in constants.values()}
    for name in ("ASSUMED_DRIVER_CALL_S", "ASSUMED_RETRY_S"):
        if name in values:
            values[f"{name}_MS"] = values[name] * 1000.0  # seconds, said in ms
    if "ASSUMED_WRITE_BPS" in values:
        values["ASSUMED_WRITE_GBPS"] = values["ASSUMED_WRITE_BPS"] / 1e9  # bytes/s, said in GB/s
    return template.format_map(values)


def _need_words(need: Any) -> str:
    """One need's label; a group is met by any of its kinds."""
    if isinstance(need, tuple):
        return " or ".join(n.label for n in need)
    return str(need.label)


def _section(cause: Any) -> list[str]:
    cid = str(cause.id)
    gpu = " (GPU only)" if cause.needs_gpu else ""
    out = [f"## `{cid}`", "", f"**{cause.title}**{gpu}: {cause.because}.", ""]
    rule = inspect.unwrap(cause.rule)
    module = sys.modules[rule.__module__]
    constants = _module_constants(module)
    out += [
        f"* **Fires when**: {_fill(cause.fires_when, constants)}.",
        f"* **Estimate**: {_fill(cause.estimate, constants)}.",
    ]
    if cause.needs:  # what a report needs among its inputs to say it checked this cause
        out.append("* **Checked on**: " + "; ".join(_need_words(n) for n in cause.needs) + ".")
    reached = _reached(rule.__name__, _functions(module))
    fixes = sorted(str(r) for r in cause.remedies)
    undeclared = sorted(set(_remedies(reached)) - set(fixes))
    if undeclared:
        raise SystemExit(f"gen_causes: {cid}'s rule advises {undeclared}, which its @cause does not name")
    if fixes:
        out.append("* **Fixes** (remedies): " + ", ".join(f"`{f}`" for f in fixes) + ".")
    path = Path(inspect.getsourcefile(rule) or "").resolve().relative_to(ROOT)
    out.append(f"* **Rule**: `{rule.__name__}` in `{path.as_posix()}`.")
    used = [constants[n] for n in sorted(_names(reached)) if n in constants]
    if used:
        out += ["", "| constant | value | what it is |", "| --- | --- | --- |"]
        out += [f"| `{c.name}` | `{c.source}` | {c.comment} |" for c in used]
    return [*out, ""]


def render() -> str:
    """The whole page, from the cause modules as they are now."""
    from pitstop.diagnose.causes import CAUSES

    causes = list(CAUSES.values())
    head = [
        "# The cause catalogue",
        "",
        f"<!-- Generated by `{COMMAND}` from src/pitstop/diagnose/causes/. "
        "Do not edit: change the code or the generator, then run it again. -->",
        "",
        f"Generated by `{COMMAND}` from the cause modules and their constants "
        "(`src/pitstop/diagnose/causes/`, one per cause); `tests/unit/test_docs.py` fails when this page is stale. "
        "A cause id, once released, keeps its meaning in the JSON. `pitstop causes` lists them too.",
        "",
        "GPU only: a cause checked only on a GPU run; a CPU run lists those as not checked. How findings are "
        "ranked and how severity follows confidence: [How it measures](how-it-measures.md#order-and-severity).",
        "",
        "| id | title | GPU only |",
        "| --- | --- | --- |",
    ]
    head += [f"| [`{c.id!s}`](#{c.id!s}) | {c.title} | {'yes' if c.needs_gpu else ''} |" for c in causes]
    body: list[str] = []
    for c in causes:
        body += _section(c)
    return "\n".join([*head, "", *body]).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write docs/causes.md from the cause modules.")
    parser.add_argument("--check", action="store_true", help="exit 1 when the page is stale, write nothing")
    parser.add_argument("--out", type=Path, default=OUT, help="the page (default: docs/causes.md)")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is stale: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
