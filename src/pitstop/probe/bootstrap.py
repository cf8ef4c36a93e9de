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
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from pitstop.probe.config import ENV_RUNNER_PID, ProbeConfig

_probe: Any = None
_armed_via: str | None = None  # the first of the autoload .pth and sitecustomize that armed this process


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callback(module)`` once ``name`` has been imported and executed, whichever import does it.

    Libraries often probe with ``importlib.util.find_spec("torch")`` long before importing it, so the
    finder stays installed until the wrapped ``exec_module`` actually runs, and only then removes itself.
    """

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.callbacks = [callback]
        self.fired = False

    def callback(self, module: ModuleType) -> None:
        for callback in self.callbacks:
            callback(module)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name or self.fired or fullname in sys.modules:
            return None
        spec = self._spec_from_the_others(fullname, path, target)
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original(module)
            if not self.fired:
                self.fired = True
                if self in sys.meta_path:
                    sys.meta_path.remove(self)
                self.callback(module)

        loader.exec_module = exec_module
        return spec

    def _spec_from_the_others(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None
    ) -> importlib.machinery.ModuleSpec | None:
        for finder in sys.meta_path:
            if isinstance(finder, _AfterImport):
                continue  # the others wrap a real finder too; asking them would go round in circles
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                return spec
        return None


def _announce_armed(config: ProbeConfig) -> None:
    if config.out_dir is not None:
        with contextlib.suppress(OSError):
            text = " ".join(sys.argv)[:2000] + f"\nvia {_armed_via or 'sitecustomize'}\n"
            (config.out_dir / f"armed-{os.getpid()}").write_text(text)


_LAUNCHER_MODULES = ("ray", "deepspeed.launcher")


def _note_launchers(config: ProbeConfig) -> None:
    """At exit, which launcher libraries this process had loaded: a job whose ranks never report is then
    told apart from one that never stepped (``runner.collect``)."""
    loaded = [name for name in _LAUNCHER_MODULES if name in sys.modules]
    if loaded and config.out_dir is not None:
        with contextlib.suppress(OSError):
            (config.out_dir / f"launchers-{os.getpid()}").write_text(" ".join(loaded))


def _install(config: ProbeConfig) -> None:
    global _probe
    try:
        from pitstop.probe.probe import Probe

        _probe = Probe(config).install()
        _announce_armed(config)
        import atexit

        atexit.register(_note_launchers, config)
    except Exception as exc:  # never take the run down
        print(
            f"pitstop: could not install the probe ({type(exc).__name__}: {exc}); run continues",
            file=sys.stderr,
        )


def _in_ray_worker() -> bool:
    return "ray" in sys.modules and "/ray/_private/workers/" in (sys.argv[0] if sys.argv else "")


def _carry_into_ray(ray: ModuleType, environ: dict[str, str]) -> None:
    """Wrap ``ray.init`` so the job's ``runtime_env`` carries pitstop's variables to every worker: a Ray
    cluster started before the job (``ray start --head``) starts its workers from its own environment, not
    the driver's. The job's own ``env_vars`` win where they name the same variable."""
    original = getattr(ray, "init", None)
    if original is None or getattr(original, "_pitstop", False):
        return
    ours = {k: v for k, v in environ.items() if k.startswith("PITSTOP_") and k != ENV_RUNNER_PID}

    def init(*args: Any, **kwargs: Any) -> Any:
        runtime_env = kwargs.get("runtime_env")
        if (
            runtime_env is None or type(runtime_env) is dict
        ):  # a RuntimeEnv object is left as the job built it
            merged = dict(runtime_env or {})
            merged["env_vars"] = {**ours, **(merged.get("env_vars") or {})}
            kwargs["runtime_env"] = merged
        return original(*args, **kwargs)

    init._pitstop = True  # type: ignore[attr-defined]
    ray.init = init  # type: ignore[attr-defined]


def _carry_into_deepspeed(runner: ModuleType) -> None:
    """DeepSpeed's launcher exports to the other nodes only the variables whose names start with one of
    ``EXPORT_ENVS`` (and what ``.deepspeed_env`` lists): pitstop's prefix joins that list in the launcher
    process that pitstop started, so every node's workers arm the probe."""
    exports = getattr(runner, "EXPORT_ENVS", None)
    if isinstance(exports, list) and "PITSTOP_" not in exports:
        exports.append("PITSTOP_")


def after_import(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Run ``callback(module)`` once ``name`` is imported (now, if it already is)."""
    if name in sys.modules:
        callback(sys.modules[name])
        return
    waiting = next((f for f in sys.meta_path if isinstance(f, _AfterImport) and f.name == name), None)
    if waiting is not None and not waiting.fired:
        waiting.callbacks.append(callback)
    else:
        sys.meta_path.insert(0, _AfterImport(name, callback))


PR_SET_PDEATHSIG = 1


def die_with_runner(environ: dict[str, str] | None = None) -> bool:
    """In the job's top process (the one pitstop started itself), ask Linux to send it SIGINT when pitstop
    dies: a pitstop killed with SIGKILL cleans up nothing, and the job must not run on unobserved. SIGINT, as
    the user's Ctrl-C, lets the job's own ``finally:`` and ``atexit`` handlers end what it started; the
    runner's reaper ends whatever is left after a grace period (SIGTERM, then SIGKILL), the processes that
    left the job's group included. A process that ignores SIGINT gets SIGKILL instead. Returns whether the
    parent-death signal was set (Linux only; elsewhere the reaper covers the job alone)."""
    env = os.environ if environ is None else environ
    runner = env.get(ENV_RUNNER_PID)
    if not runner or not sys.platform.startswith("linux") or str(os.getppid()) != runner:
        return False  # deeper processes of the job: their own parents (torchrun, DataLoader) watch them
    try:
        import ctypes
        import signal

        # a process that ignores SIGINT (started from a script in the background) could not be stopped so
        ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        sig = signal.SIGKILL if ignored else signal.SIGINT
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
        if str(os.getppid()) != runner:  # pitstop died before the signal was set: nobody would send it
            os.kill(os.getpid(), sig)
        return True
    except (OSError, AttributeError):
        return False


def arm(environ: dict[str, str] | None = None, via: str = "sitecustomize") -> bool:
    """Arm the fixes `pitstop tune` asked for, and the probe if the runner asked for it. Returns whether
    the probe was armed. Once per process: the autoload .pth and the PYTHONPATH sitecustomize may both
    fire, and the second finds the first's work done."""
    global _armed_via
    if _armed_via is not None:
        return ProbeConfig.from_env(environ) is not None
    _armed_via = via
    from pitstop.trials.request import FixRequest

    die_with_runner(environ)

    request = FixRequest.from_env(environ)
    if request is not None:
        from pitstop.remedies.arming import arm_fixes

        arm_fixes(request, after_import)
    config = ProbeConfig.from_env(environ)
    if config is None:
        return False
    if not _in_ray_worker():
        env = dict(os.environ if environ is None else environ)
        after_import("ray", lambda ray: _carry_into_ray(ray, env))
        after_import("deepspeed.launcher.runner", _carry_into_deepspeed)
    # installed at once, in a Ray worker too: Ray Train sets RANK after torch is imported, and the probe reads it
    # again at the first step
    after_import("torch", lambda module: _install(config))
    return True
