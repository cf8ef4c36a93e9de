"""The branch and commit of the checkout a run was started from, read from ``.git`` without running git.

Reading the files is instant and cannot hang on a slow or locked repository; anything unexpected gives
``None`` rather than a guess.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


def _git_dir(start: Path) -> Path | None:
    for folder in (start, *start.parents):
        dot_git = folder / ".git"
        if dot_git.is_dir():
            return dot_git
        if dot_git.is_file():  # a worktree or submodule: "gitdir: <path>"
            text = dot_git.read_text(errors="replace").strip()
            if text.startswith("gitdir:"):
                target = Path(text[len("gitdir:") :].strip())
                return target if target.is_absolute() else (folder / target).resolve()
            return None
    return None


def _resolve_ref(git_dir: Path, ref: str) -> str | None:
    common = git_dir
    commondir = git_dir / "commondir"
    if commondir.is_file():
        target = Path(commondir.read_text().strip())
        common = target if target.is_absolute() else (git_dir / target).resolve()
    for base in (git_dir, common):
        loose = base / ref
        if loose.is_file():
            sha = loose.read_text().strip()
            return sha if _SHA.match(sha) else None
    packed = common / "packed-refs"
    if packed.is_file():
        for line in packed.read_text(errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1] == ref and _SHA.match(parts[0]):
                return parts[0]
    return None


def git_head(start: Path | None = None) -> tuple[str | None, str | None]:
    """``(branch, commit)`` of the checkout holding ``start`` (default: the working directory).

    A detached HEAD has no branch; outside a checkout both are ``None``.
    """
    try:
        git_dir = _git_dir((start or Path.cwd()).resolve())
        if git_dir is None or not (git_dir / "HEAD").is_file():  # is_file: a FIFO would block the read
            return None, None
        head = (git_dir / "HEAD").read_text(errors="replace").strip()
        if head.startswith("ref:"):
            ref = head[len("ref:") :].strip()
            branch = ref.removeprefix("refs/heads/")
            return branch or None, _resolve_ref(git_dir, ref)
        return None, head if _SHA.match(head) else None
    except OSError:
        return None, None


def resolve_label(label: str | None, start: Path | None = None) -> str | None:
    """``--label`` > ``$PITSTOP_LABEL`` > the current git branch > ``None``."""
    if label:
        return label
    env = os.environ.get("PITSTOP_LABEL", "").strip()
    if env:
        return env
    return git_head(start)[0]
