"""Run a public script twice, the same way and at the same time: under ``pitstop doctor --full`` and on its
own.

``--full`` lets the script finish (it writes its own logs and state at the end, as it would without
pitstop); ``--verbose`` passes its output through, so what it prints can be read back. Both runs get the
same offline environment and working folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import ROOT, run_pitstop

COMPAT = [sys.executable, "-m", "tests.public_scripts.compat"]


def offline_env(work: Path) -> dict[str, str]:
    """No network, caches in the test's folder, the repository importable (for the compat runner)."""
    return {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": str(work / "hf_home"),
        "HF_DATASETS_CACHE": str(work / "hf_datasets"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "TOKENIZERS_PARALLELISM": "false",
        "WANDB_MODE": "disabled",
    }


@dataclass
class Runs:
    doc: dict[str, Any]  # pitstop's JSON document
    observed: str  # the script's output under pitstop
    plain: str  # the script's output on its own


def under_pitstop(
    work: Path, command: list[str], warmup: int, env: dict[str, str], timeout: float = 600
) -> tuple[dict[str, Any], str]:
    """``pitstop doctor --verbose --full --json``: the JSON document and everything printed."""
    out = work / "run.json"
    args = ["doctor", "--verbose", "--full", "--warmup", str(warmup), "--json", str(out), "--no-history"]
    proc = run_pitstop(*args, "--", *command, env=env, cwd=work, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(out.read_text()), proc.stdout + proc.stderr


def on_its_own(work: Path, command: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """The script on its own, started in the background (it runs beside the observed run: each compares
    only with itself, so the two need not take turns)."""
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
        cwd=work,
    )


def run_twice(work: Path, command: list[str], warmup: int, env: dict[str, str], between: Any = None) -> Runs:
    """The script under pitstop in ``work/observed`` and on its own in ``work/plain``, at the same time
    (``between`` may prepare each folder: it gets the folder). The timing pitstop is held to is the
    observed run's own log, so the plain run beside it changes nothing that is compared."""
    folders = {}
    for name in ("observed", "plain"):
        folders[name] = work / name
        folders[name].mkdir(parents=True, exist_ok=True)
        if between is not None:
            between(folders[name])

    def cmd(name: str) -> list[str]:
        return [part.replace("{work}", str(folders[name])) for part in command]

    plain = on_its_own(folders["plain"], cmd("plain"), env)
    try:
        doc, observed = under_pitstop(folders["observed"], cmd("observed"), warmup, env)
        out, err = plain.communicate(timeout=600)
    finally:
        if plain.poll() is None:
            plain.kill()
            plain.wait()
    assert plain.returncode == 0, out[-4000:] + err[-4000:]
    return Runs(doc, observed, out + err)
