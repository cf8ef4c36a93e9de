"""What `pitstop tune` asks of one trial process, passed down in environment variables, and what the
process reports back: which fixes it applied, which it could not, and the first steps' losses."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pitstop.atomic import write_atomic

ENV_FIXES = "PITSTOP_FIXES"  # comma-separated fix ids to apply in this process
ENV_ATTN = "PITSTOP_FIX_ATTN"  # the attention implementation the model will run (for packed masks)
ENV_ATTN_TARGET = "PITSTOP_FIX_ATTN_TARGET"  # what the attention fix switches to: sdpa, flash_attention_2
ENV_SCRATCH = "PITSTOP_SCRATCH"  # where the job's checkpoints and logs go during trials
ENV_LOSS_STEPS = "PITSTOP_LOSS_STEPS"  # record the losses of this many first optimizer steps
ENV_REPORT = "PITSTOP_FIX_REPORT"  # folder for the per-process reports
ENV_MICRO_BATCH_FACTOR = "PITSTOP_MICRO_BATCH_FACTOR"  # the most the micro-batch may grow


@dataclass
class FixRequest:
    fixes: frozenset[str] = frozenset()
    attn: str | None = None
    attn_target: str = "sdpa"
    scratch: Path | None = None
    loss_steps: int = 0
    report_dir: Path | None = None
    micro_batch_factor: int = 4

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> FixRequest | None:
        """The request of the runner, or None when this process was not asked for anything."""
        env = os.environ if environ is None else environ
        fixes = frozenset(f for f in env.get(ENV_FIXES, "").split(",") if f)
        scratch = env.get(ENV_SCRATCH)
        loss_steps = int(env.get(ENV_LOSS_STEPS, "0") or 0)
        if not fixes and not scratch and not loss_steps:
            return None
        report = env.get(ENV_REPORT)
        return cls(
            fixes=fixes,
            attn=env.get(ENV_ATTN) or None,
            attn_target=env.get(ENV_ATTN_TARGET) or "sdpa",
            scratch=Path(scratch) if scratch else None,
            loss_steps=loss_steps,
            report_dir=Path(report) if report else None,
            micro_batch_factor=int(env.get(ENV_MICRO_BATCH_FACTOR, "4") or 4),
        )

    def to_env(self) -> dict[str, str]:
        env = {ENV_FIXES: ",".join(sorted(self.fixes)), ENV_ATTN_TARGET: self.attn_target}
        if self.attn:
            env[ENV_ATTN] = self.attn
        if self.scratch is not None:
            env[ENV_SCRATCH] = str(self.scratch)
        if self.loss_steps:
            env[ENV_LOSS_STEPS] = str(self.loss_steps)
        if self.report_dir is not None:
            env[ENV_REPORT] = str(self.report_dir)
        env[ENV_MICRO_BATCH_FACTOR] = str(self.micro_batch_factor)
        return env


@dataclass
class FixReport:
    """One process's account, rewritten whole (atomically) whenever it changes."""

    path: Path | None
    applied: dict[str, str] = field(default_factory=dict)  # fix -> what was changed
    skipped: dict[str, str] = field(default_factory=dict)  # fix -> why it could not be applied
    losses: list[float] = field(default_factory=list)
    redirected: list[str] = field(default_factory=list)
    params: dict[str, dict[str, Any]] = field(default_factory=dict)  # fix -> the advice's parameters
    revoked: dict[str, str] = field(default_factory=dict)  # fix -> why its check found it not in effect

    def apply(self, fix: str, what: str, **params: Any) -> None:
        """``params``: what the remedy's advice needs to describe this change (e.g. the new micro-batch)."""
        if self.applied.get(fix) != what or (params and self.params.get(fix) != params):
            self.applied[fix] = what
            if params:
                self.params[fix] = params
            self.skipped.pop(fix, None)
            self.save()

    def revoke(self, fix: str, why: str) -> None:
        """An applied fix found undone later (the job changed it back): it no longer counts as applied."""
        self.applied.pop(fix, None)
        self.params.pop(fix, None)
        self.skipped[fix] = why
        self.revoked[fix] = why
        self.save()

    def skip(self, fix: str, why: str) -> None:
        """The first reason stands: later loaders (a framework's rebuild of the same one) say less."""
        if fix not in self.applied and fix not in self.skipped:
            self.skipped[fix] = why
            self.save()

    def save(self) -> None:
        if self.path is None:
            return
        payload = {
            "rank": int(os.environ.get("RANK", "0")),
            "applied": self.applied,
            "skipped": self.skipped,
            "losses": self.losses,
            "redirected": self.redirected,
            "params": self.params,
            "revoked": self.revoked,
        }
        with contextlib.suppress(OSError):
            write_atomic(self.path, json.dumps(payload))


def read_reports(folder: Path) -> list[dict]:
    """Every process's report (rank 0 first)."""
    reports = []
    for path in sorted(folder.glob("fixes-*.json")):
        with contextlib.suppress(OSError, ValueError):
            reports.append(json.loads(path.read_text()))
    return sorted(reports, key=lambda r: r.get("rank", 0))
