"""Where the history lives: ``--history`` > ``$PITSTOP_HISTORY`` > the platform's per-user data folder.

The home folder is ``$HOME`` when it is set to an absolute path, else the user's entry in the password
database; an empty ``HOME`` (``HOME= pitstop …``, some CI runners and containers) must not put the history
under ``/.local/share``, and where no home can be found at all the history is refused in one line that says
how to name one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pitstop.history.errors import HistoryError

ENV_VAR = "PITSTOP_HISTORY"
FILENAME = "history.sqlite3"


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


def default_path() -> Path:
    """The history file used when ``--history`` is not given."""
    env = os.environ.get(ENV_VAR, "")
    if env:
        return _expand(env)
    return _data_home() / "pitstop" / FILENAME


def resolve_path(path: Path | str | None) -> Path:
    return _expand(str(path)) if path else default_path()
