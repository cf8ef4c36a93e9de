"""The docs stay true to the code: docs/causes.md is what tools/gen_causes.py writes from the catalogue and
the rules today, the README stays an introduction (at most 250 lines), and its links lead to files."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 250


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_causes", ROOT / "tools" / "gen_causes.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up while it is defined
    spec.loader.exec_module(module)
    return module


def test_causes_page_is_what_the_generator_writes_now() -> None:
    written = (ROOT / "docs" / "causes.md").read_text(encoding="utf-8")
    assert written == _generator().render(), "docs/causes.md is stale: run `python tools/gen_causes.py`"


def test_causes_page_lists_every_cause_with_its_gpu_flag() -> None:
    from pitstop.diagnose.causes import CAUSES

    page = (ROOT / "docs" / "causes.md").read_text(encoding="utf-8")
    for cause in CAUSES.values():
        assert f"## `{cause.id!s}`" in page
        row = next(line for line in page.splitlines() if line.startswith(f"| [`{cause.id!s}`]"))
        assert row.endswith("| yes |") == cause.needs_gpu, row
    from pitstop.diagnose.causes import dataloader_bound as inputs

    assert "`dataloader_bound` in `src/pitstop/diagnose/causes/dataloader_bound.py`" in page
    assert f"| `DATA_WAIT_MIN` | `{inputs.DATA_WAIT_MIN!r}` |" in page  # the threshold as the rule has it
    assert f"data wait ≥ {inputs.DATA_WAIT_MIN:.0%} of the step" in page


def test_a_stale_page_is_caught(tmp_path: Path) -> None:
    generator = _generator()
    page = tmp_path / "causes.md"
    page.write_text(generator.render().replace("≥ 5%", "≥ 7%", 1), encoding="utf-8")
    out = ["--out", str(page)]
    assert generator.main(["--check", *out]) == 1
    assert generator.main(out) == 0
    assert generator.main(["--check", *out]) == 0


def test_readme_is_an_introduction() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail to docs/"
    text = "\n".join(lines)
    assert text.index("make demo") < text.index("## Install"), "the fresh-machine commands come first"


def test_readme_links_lead_to_files() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if "://" not in t]
    assert local, "the README links to the docs"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, missing


def _nav_pages(node: object) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [page for value in node.values() for page in _nav_pages(value)]
    if isinstance(node, list):
        return [page for item in node for page in _nav_pages(item)]
    return []


def test_every_docs_page_is_in_the_site_nav_and_every_nav_entry_exists() -> None:
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    nav = _nav_pages(config["nav"])
    pages = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(nav) == pages, "mkdocs.yml's nav and docs/*.md differ (make docs would fail)"
