"""How the probe reaches every Python process of the observed command.

Two paths, one environment. Where pitstop is installed, its ``pitstop-autoload.pth`` arms the probe in every
interpreter that starts with PITSTOP_OUT in its environment, so launchers that pass the environment on (Ray's
raylet, DeepSpeed's launcher, a container run with ``-e``) carry it. As a fallback for interpreters without
pitstop, a scratch folder holding ``sitecustomize.py`` and a link to the pitstop package goes first on
PYTHONPATH. The interpreter flags that defeat both are found here before the run (:func:`blind_spot`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from pitstop.probe.autoload import PTH_NAME
from pitstop.probe.config import ProbeConfig

DOCS = "docs/where-it-runs.md"
_PYTHON = re.compile(r"^(python|pypy)(\d+(\.\d+)?)?$")
_TAKES_ARG = set("WXQ")  # short options whose value follows (-W ignore, -X dev)

PACKAGE = Path(__file__).parent.parent  # this pitstop's package folder (src/pitstop or site-packages/pitstop)
INJECT_SOURCE = PACKAGE / "probe" / "_inject" / "sitecustomize.py"


def prepare_injection(out_dir: Path) -> Path:
    """Make the folder that goes first on PYTHONPATH: sitecustomize.py plus a link to this pitstop."""
    inject = out_dir / "inject"
    inject.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(INJECT_SOURCE, inject / "sitecustomize.py")
    link = inject / "pitstop"
    if not link.exists():
        link.symlink_to(PACKAGE, target_is_directory=True)
    return inject


def child_environment(
    config: ProbeConfig, inject: Path, base: dict[str, str] | None = None
) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    existing = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(inject) + (os.pathsep + existing if existing else "")
    env.update(config.to_env())
    return env


def interpreter_flags(command: Sequence[str]) -> tuple[str, set[str]] | None:
    """The interpreter and its one-letter flags when ``command`` runs Python directly (through ``env`` too),
    else None (launchers start their workers with flags of their own choosing)."""
    args = list(command)
    if args and os.path.basename(args[0]) == "env":
        args = args[1:]
        while args and ("=" in args[0] or args[0].startswith("-")):
            args = args[1:]
    if not args or not _PYTHON.match(os.path.basename(args[0])):
        return None
    flags: set[str] = set()
    rest = iter(args[1:])
    for arg in rest:
        if not arg.startswith("-") or arg in ("-", "--") or arg.startswith("--"):
            break
        for i, letter in enumerate(arg[1:]):
            if letter in "cm":
                return args[0], flags
            flags.add(letter)
            if letter in _TAKES_ARG:
                if i == len(arg) - 2:
                    next(rest, None)  # the value is the next argument (-X dev), not glued on (-Xdev)
                break
    return args[0], flags


def _sees_autoload(python: str, flags: set[str], env: dict[str, str]) -> bool:
    """Whether ``python`` with these flags processes an installed ``pitstop-autoload.pth``."""
    probe = (
        f"import sys, os; print(int(any(os.path.isfile(os.path.join(p, {PTH_NAME!r})) for p in sys.path)))"
    )
    opts = [f"-{f}" for f in sorted(flags & set("IEsS"))]
    try:
        out = subprocess.run(
            [python, *opts, "-c", probe], env=env, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.stdout.strip() == "1"


def blind_spot(command: Sequence[str], env: dict[str, str] | None = None) -> str | None:
    """One line saying why pitstop cannot see inside ``command`` and what to do, or None when it can.

    -S skips site: neither the .pth nor sitecustomize runs. -E and -I ignore PYTHONPATH (the fallback),
    so they hide the job only from an interpreter where pitstop is not installed; -I and -s (or
    PYTHONNOUSERSITE) also skip a ``pip install --user`` pitstop. PITSTOP_OUT itself is read from the
    environment, which no flag clears."""
    found = interpreter_flags(command)
    if found is None:
        return None
    python, flags = found
    base = dict(os.environ if env is None else env)
    if "S" in flags:
        why = "-S skips Python's site initialization, where pitstop arms its probe"
        return f"pitstop cannot see inside this job: {why}; call pitstop.watch() in the script or drop -S"
    if not flags & {"I", "E", "s"} or _sees_autoload(python, flags, base):
        return None
    named = "/".join(f"-{f}" for f in sorted(flags & {"I", "E", "s"}))
    why = f"{named} makes `{python}` ignore PYTHONPATH or the user site, and pitstop is not installed in it"
    return (
        f"pitstop cannot see inside this job: {why}; call pitstop.watch() in the script, drop the flag, "
        f"or install pitstop in that interpreter (see {DOCS})"
    )
