"""Switch the debugging aids off for training runs: anomaly detection, blocking launches, the distributed
debug checks, deterministic algorithms. None changes what the model computes (deterministic algorithms
change only the order of floating-point sums), so a run without them trains the same.

A trial keeps them off inside the job, without editing it: as torch finishes importing, autograd's anomaly
switch ``torch.set_anomaly_enabled`` (which ``set_detect_anomaly(True)``, ``detect_anomaly()`` and Lightning's
``detect_anomaly=True`` all call) and ``torch.use_deterministic_algorithms`` are wrapped to hand a request to
switch on over as off; ``CUDA_LAUNCH_BLOCKING`` and ``TORCH_DISTRIBUTED_DEBUG`` are unset in the process (and
so in the ranks a launcher starts from it) before CUDA starts, and c10d's debug level, read as torch imports,
is set back to OFF; a Trainer's ``full_determinism`` becomes the plain ``set_seed`` of the same seed. No runner
change: each trial process does it to itself. At the first optimizer step the trial checks that anomaly
detection and deterministic algorithms are still off (a mode switched on some other way revokes the fix)."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.frames import job_line
from pitstop.remedies.base import Advice, Remedy, TrialFacts, at_first_optimizer_step, code, register
from pitstop.trials.request import FixReport, FixRequest

ENV_SETTING = re.compile(r"[A-Z_][A-Z0-9_]*=")  # a setting that is an environment variable
# the debugging variables a trial unsets, and the values that already mean "off"
DEBUG_ENV = {"CUDA_LAUNCH_BLOCKING": ("", "0"), "TORCH_DISTRIBUTED_DEBUG": ("", "OFF")}


@register
class DebugOff(Remedy):
    id = RemedyId.DEBUG_OFF
    title = "debug modes off for training"
    effect = "same training; no anomaly stacks, blocking launches or extra checks"
    tunable = True
    tune_rank = 105

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``anomaly``: anomaly detection was on (``site``: the job's line that switched it on);
        ``settings``: the slow settings seen ("CUDA_LAUNCH_BLOCKING=1", ...); ``profilers``: profilers and tracers
        left running (their names as the probe wrote them)."""
        anomaly = params.get("anomaly", True)
        site = params.get("site")
        settings: list[str] = list(params.get("settings") or [])
        parts = []
        if anomaly:
            where = f" (at {site})" if site else ""
            parts.append(
                "Switch autograd's anomaly detection off for training runs"
                f"{where}: it records a stack for every operation and checks every gradient, every step. "
                "Turn it on again only to find where a NaN starts."
            )
        # environment variables only ("CUDA_LAUNCH_BLOCKING=1"), not "TrainingArguments(full_determinism=True)"
        env = [s.split("=", 1)[0] for s in settings if ENV_SETTING.match(s)]
        if env:
            parts.append(
                f"Unset {', '.join(env)} in the job's environment: "
                f"{'they are' if len(env) > 1 else 'it is'} for debugging."
            )
        if any(s.startswith("torch.use_deterministic_algorithms") for s in settings):
            parts.append(
                "Drop torch.use_deterministic_algorithms(True) unless bit-exact reruns are required."
            )
        if any(s.startswith("TrainingArguments(full_determinism") for s in settings):
            parts.append(
                "Drop full_determinism=True (it switches deterministic algorithms on and sets "
                "CUDA_LAUNCH_BLOCKING=1); the Trainer seeds the same way without it."
            )
        profilers: list[str] = list(params.get("profilers") or [])
        if profilers:
            parts.append(
                f"Stop {' and '.join(profilers)} for training runs: it hooks every operation or Python call of "
                "every step. Profile a few steps on purpose (torch.profiler's schedule, Lightning's "
                "profiler=None the default), not the whole run."
            )
        if not parts:
            parts.append(
                "Switch the debugging aids off for training runs: anomaly detection, CUDA_LAUNCH_BLOCKING, "
                "TORCH_DISTRIBUTED_DEBUG and deterministic algorithms each slow every step."
            )
        return Advice(" ".join(parts), self._snippet(framework, env))

    def _snippet(self, framework: Framework, env: list[str]) -> str:
        unset = "".join(f"\nunset {name}" for name in env)
        anomaly_off = code("""
            torch.autograd.set_detect_anomaly(False)   # or remove the set_detect_anomaly / detect_anomaly() call
        """)
        if framework.is_trainer:
            determinism = f"args = {framework.args_class}(..., full_determinism=False)   # the default"
            return f"{anomaly_off}\n{determinism}{unset}"
        if framework is Framework.LIGHTNING:
            return (
                code("""
                trainer = L.Trainer(..., detect_anomaly=False)   # the default; True runs every step under it
            """)
                + unset
            )
        return anomaly_off + unset

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.HF_TRAINER, Framework.TRL, Framework.LIGHTNING, Framework.PYTORCH)

    def cannot_try(self, facts: TrialFacts) -> str | None:
        return None

    # -- trial hooks ----------------------------------------------------------------------------------
    def on_import(self) -> Mapping[str, Any]:
        return {"torch": self._keep_off}

    def _keep_off(self, torch: ModuleType, request: FixRequest, report: FixReport) -> None:
        """Unset the debugging variables, hand every request to switch a debug mode on over as off, and check
        at the first optimizer step that the modes are still off."""

        def note(what: str, site: str | None = None, setting: str | None = None) -> None:
            self._record(report, what, anomaly=what.startswith("anomaly"), site=site, setting=setting)

        for setting in _unset_debug_env(torch):
            note(f"{setting.split('=', 1)[0]} unset", setting=setting)

        anomaly = torch.set_anomaly_enabled

        def set_anomaly_enabled(enabled: bool, *args: Any, **kwargs: Any) -> Any:
            if enabled:
                line = job_line(sys._getframe(1))
                note(f"anomaly detection kept off ({line or 'switched on by the job'})", site=line)
            return anomaly(False if enabled else enabled, *args, **kwargs)

        deterministic = torch.use_deterministic_algorithms

        def use_deterministic_algorithms(mode: bool, *args: Any, **kwargs: Any) -> Any:
            if mode:
                setting = "torch.use_deterministic_algorithms(True)"
                note(f"{setting} kept off", setting=setting)
            return deterministic(False if mode else mode, *args, **kwargs)

        set_anomaly_enabled.__wrapped__ = anomaly  # type: ignore[attr-defined]
        use_deterministic_algorithms.__wrapped__ = deterministic  # type: ignore[attr-defined]
        torch.set_anomaly_enabled = set_anomaly_enabled  # type: ignore[attr-defined]
        torch.use_deterministic_algorithms = use_deterministic_algorithms  # type: ignore[attr-defined]

        def check() -> None:
            on = [
                what
                for what, still in (
                    ("anomaly detection", torch.is_anomaly_enabled()),
                    ("deterministic algorithms", torch.are_deterministic_algorithms_enabled()),
                )
                if still
            ]
            if on:
                why = f"{' and '.join(on)} still on at the first optimizer step (switched on some other way)"
                (report.revoke if self.id in report.applied else report.skip)(self.id, why)
            elif self.id not in report.applied:
                report.skip(self.id, "no debug mode was on before the first optimizer step")

        at_first_optimizer_step(check)

    def rewrite_training_args(self, args: Any, request: FixRequest, report: FixReport) -> None:
        """The Trainer's ``full_determinism`` switches deterministic algorithms on and sets
        CUDA_LAUNCH_BLOCKING=1; without it the Trainer seeds the same way (``set_seed(args.seed)``)."""
        if getattr(args, "full_determinism", False):
            args.full_determinism = False
            what = "TrainingArguments(full_determinism=False): the same seed, no blocking launches"
            self._record(report, what, setting="TrainingArguments(full_determinism=True)")

    def _record(
        self,
        report: FixReport,
        what: str,
        anomaly: bool = False,
        site: str | None = None,
        setting: str | None = None,
    ) -> None:
        """Add one change to what the trial reports, with the advice's parameters of all of them together."""
        parts = [part for part in report.applied.get(self.id, "").split("; ") if part]
        if what in parts:
            return
        known = report.params.get(self.id, {})
        settings = [*known.get("settings", []), *([setting] if setting else [])]
        report.apply(
            self.id,
            "; ".join([*parts, what]),
            anomaly=bool(known.get("anomaly")) or anomaly,
            site=known.get("site") or site,
            settings=list(dict.fromkeys(settings)),
        )


def _unset_debug_env(torch: ModuleType) -> list[str]:
    """Unset the debugging variables in this process (its children inherit it) before CUDA starts; c10d read
    its debug level as torch imported: set it back to OFF. Returns the settings unset ("NAME=value")."""
    unset = []
    for name, off in DEBUG_ENV.items():
        if os.environ.get(name, "").strip().upper() not in off:
            unset.append(f"{name}={os.environ.pop(name)}")
    if any(s.startswith("TORCH_DISTRIBUTED_DEBUG=") for s in unset):
        distributed = sys.modules.get("torch.distributed")
        debug_level = getattr(distributed, "DebugLevel", None)
        if distributed is not None and debug_level is not None and hasattr(distributed, "set_debug_level"):
            distributed.set_debug_level(debug_level.OFF)
    return unset
