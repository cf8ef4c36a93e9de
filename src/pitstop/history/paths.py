"""Where the history lives: ``--history`` > ``$PITSTOP_HISTORY`` > one file per project in the platform's
per-user data folder.

A project is the git checkout holding the working directory (the folder with ``.git``; a worktree is its own
checkout), or the working directory itself outside one. Its history is ``pitstop/history/<name>-<hash>.sqlite3``
under the data folder: the folder's name, made safe for a file name, and 12 hex digits of the SHA-256 of its
absolute path, so two checkouts with the same name keep apart. The single ``pitstop/history.sqlite3`` that
served every project before is never written again and never moved: ``legacy_path()`` names it for reading
(``pitstop history list --all-projects`` lists it beside the projects' files).

The home folder is ``$HOME`` when it is set to an absolute path, else the user's entry in the password
database; an empty ``HOME`` (``HOME= pitstop …``, some CI runners and containers) must not put the history
under ``/.local/share``, and where no home can be found at all the history is refused in one line that says
how to name one.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path

from pitstop.history.errors import HistoryError

ENV_VAR = "PITSTOP_HISTORY"
FILENAME = "history.sqlite3"  # the one history every project shared before per-project files (legacy_path)
PROJECTS_FOLDER = "history"  # under pitstop's data folder: one <name>-<hash>.sqlite3 per project
SUFFIX = ".sqlite3"
HASH_DIGITS = 12  # of the SHA-256 of the project's path: 48 bits, no clash among one user's checkouts
NAME_CHARS = 40  # of the project folder's name kept in the file name (the hash tells them apart)
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def home() -> Path:
    """The user's home folder: an absolute ``$HOME``, else the password database's (never ``/``)."""
    env = os.environ.get("HOME", "")
    if env and os.path.isabs(env):
        return Path(env)
    try:
        import pwd

        entry = pwd.getpwuid(os.getuid()).pw_dir
    except (ImportError, KeyError, OSError):
        entry = ""
    if entry and os.path.isabs(entry) and entry != "/":
        return Path(entry)
    if sys.platform == "win32":
        return Path.home()
    raise HistoryError(
        "no home folder for the history ($HOME is empty or relative and the user has none): "
        f"give --history PATH or set {ENV_VAR}"
    )


def _data_home() -> Path:
    xdg = os.environ.get("XDG_DATA_HOME", "")
    if xdg and Path(xdg).is_absolute():  # the XDG spec says to ignore a relative value
        return Path(xdg)
    if sys.platform == "darwin":
        return home() / "Library" / "Application Support"
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"])
    return home() / ".local" / "share"


def _expand(text: str) -> Path:
    """``~`` and ``~/…`` against ``home()`` (an empty ``HOME`` would make them ``/``); ``~user`` as usual."""
    if text == "~" or text.startswith("~/"):
        return home() / text[2:]
    return Path(text).expanduser()


def _pitstop_data() -> Path:
    return _data_home() / "pitstop"


def project_root(start: Path | None = None) -> Path:
    """The git checkout holding ``start`` (default: the working directory): the nearest folder with a
    ``.git`` folder or file (a worktree, a submodule); outside a checkout, ``start`` itself."""
    folder = (start or Path.cwd()).resolve()
    for candidate in (folder, *folder.parents):
        try:
            if (candidate / ".git").exists():
                return candidate
        except OSError:  # an unreadable folder on the way up: no checkout found through it
            break
    return folder


def project_file_name(root: Path) -> str:
    """``<name>-<hash>.sqlite3``: the folder's name made safe for any file system, and the hash of its path."""
    name = _UNSAFE.sub("_", root.name).strip("._-")[:NAME_CHARS] or "root"
    digest = hashlib.sha256(str(root).encode("utf-8", "surrogateescape")).hexdigest()[:HASH_DIGITS]
    return f"{name}-{digest}{SUFFIX}"


def projects_folder() -> Path:
    """Where the per-project histories live."""
    return _pitstop_data() / PROJECTS_FOLDER


def project_path(start: Path | None = None) -> Path:
    """The default history of the project holding ``start`` (default: the working directory)."""
    return projects_folder() / project_file_name(project_root(start))


def legacy_path() -> Path:
    """The single history every project shared before per-project files: read, never written by default."""
    return _pitstop_data() / FILENAME


def project_histories() -> list[Path]:
    """Every per-project history file in the data folder, by name (the legacy file not included)."""
    folder = projects_folder()
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name.endswith(SUFFIX) and p.is_file())


def uses_default(path: Path | str | None) -> bool:
    """True when neither ``--history`` nor ``$PITSTOP_HISTORY`` names the file: the project's own is used."""
    return not path and not os.environ.get(ENV_VAR, "")


def default_path(start: Path | None = None) -> Path:
    """The history file used when ``--history`` is not given: ``$PITSTOP_HISTORY``, else the history of the
    project holding ``start`` (default: the working directory, where a job started by pitstop runs)."""
    env = os.environ.get(ENV_VAR, "")
    if env:
        return _expand(env)
    return project_path(start)


def resolve_path(path: Path | str | None) -> Path:
    return _expand(str(path)) if path else default_path()
