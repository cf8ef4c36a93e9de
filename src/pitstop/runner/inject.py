"""How the probe reaches every Python process of the observed command.

A scratch folder holding pitstop's ``sitecustomize.py`` and a link to the pitstop package goes first on
PYTHONPATH, so the command's interpreters (torchrun's and accelerate's children included, even from another
virtual environment) arm the probe at start-up; the probe's configuration travels in the environment.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pitstop
from pitstop.probe.config import ProbeConfig

INJECT_SOURCE = Path(pitstop.__file__).parent / "probe" / "_inject" / "sitecustomize.py"


def prepare_injection(out_dir: Path) -> Path:
    """Make the folder that goes first on PYTHONPATH: sitecustomize.py plus a link to this pitstop."""
    inject = out_dir / "inject"
    inject.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(INJECT_SOURCE, inject / "sitecustomize.py")
    link = inject / "pitstop"
    if not link.exists():
        link.symlink_to(Path(pitstop.__file__).parent, target_is_directory=True)
    return inject


def child_environment(
    config: ProbeConfig, inject: Path, base: dict[str, str] | None = None
) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    existing = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(inject) + (os.pathsep + existing if existing else "")
    env.update(config.to_env())
    return env
