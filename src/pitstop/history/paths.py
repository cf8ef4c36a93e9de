"""Where the history lives: ``--history`` > ``$PITSTOP_HISTORY`` > the platform's per-user data folder."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENV_VAR = "PITSTOP_HISTORY"
FILENAME = "history.sqlite3"


def _data_home() -> Path:
    xdg = os.environ.get("XDG_DATA_HOME", "")
    if xdg and Path(xdg).is_absolute():  # the XDG spec says to ignore a relative value
        return Path(xdg)
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support"
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"])
    return Path.home() / ".local" / "share"


def default_path() -> Path:
    """The history file used when ``--history`` is not given."""
    env = os.environ.get(ENV_VAR, "")
    if env:
        return Path(env).expanduser()
    return _data_home() / "pitstop" / FILENAME


def resolve_path(path: Path | str | None) -> Path:
    return Path(path).expanduser() if path else default_path()
