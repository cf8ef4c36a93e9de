"""Arming the probe in a process the zero-code runner started, without importing torch early.

``sitecustomize`` (put first on PYTHONPATH by the runner) calls :func:`arm`. If this process was asked
to be observed, a one-shot import hook waits for ``import torch`` to finish and only then installs the
probe, so processes that never import torch (launchers, shells, tools) are left alone and nothing
about torch's own start-up changes.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from pitstop.probe.config import ProbeConfig

_probe: Any = None


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds ``name`` through the other finders and runs ``callback(module)`` once it has executed."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.callback = callback

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module
        callback = self.callback

        def exec_module(module: ModuleType) -> None:
            original(module)
            callback(module)

        loader.exec_module = exec_module
        return spec


def _announce_armed(config: ProbeConfig) -> None:
    if config.out_dir is not None:
        with contextlib.suppress(OSError):
            (config.out_dir / f"armed-{os.getpid()}").write_text(" ".join(sys.argv)[:2000])


def _install(config: ProbeConfig) -> None:
    global _probe
    try:
        from pitstop.probe.probe import Probe

        _probe = Probe(config).install()
        _announce_armed(config)
    except Exception as exc:  # never take the run down
        print(
            f"pitstop: could not install the probe ({type(exc).__name__}: {exc}); run continues",
            file=sys.stderr,
        )


def arm(environ: dict[str, str] | None = None) -> bool:
    """Arm the probe if the runner asked for it. Returns whether it was armed."""
    config = ProbeConfig.from_env(environ)
    if config is None:
        return False
    if "torch" in sys.modules:
        _install(config)
    else:
        sys.meta_path.insert(0, _AfterImport("torch", lambda _module: _install(config)))
    return True
