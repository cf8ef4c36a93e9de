"""Hugging Face Trainer outputs: trainer_state.json, train_results.json, all_results.json.

They carry whole-run figures, not steps: runtime, samples/s, tokens seen (when the run counted them),
``total_flos`` (the Trainer's 6·N·tokens count, summed over processes), and in ``log_history`` every
evaluation's runtime. Checkpoint saves are counted from ``save_steps``; their duration is not logged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pitstop.core.profile import Environment, RunTotals


@dataclass
class TrainerOutputs:
    totals: RunTotals
    env: Environment
    notes: list[str] = field(default_factory=list)


def is_trainer_state(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("log_history"), list)


def is_results(data: Any) -> bool:
    return isinstance(data, dict) and any(k in data for k in ("train_runtime", "train_samples_per_second"))


def _num(value: Any) -> float | None:
    """A finite, positive number, else None: a runtime, a rate or a count of 0 or below says nothing."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) and number > 0 else None


def _negative(data: dict[str, Any], entries: list[dict[str, Any]]) -> int:
    """How many figures pitstop reads are negative or NaN (each is ignored)."""
    keys = (
        "train_runtime",
        "train_samples_per_second",
        "train_steps_per_second",
        "total_flos",
        "num_input_tokens_seen",
        "num_tokens",
        "eval_runtime",
        "global_step",
    )
    count = 0
    for entry in (data, *entries):
        for key in keys:
            value = entry.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool) and not value >= 0:
                count += 1  # negative, or NaN when the document was not cleaned
    return count


def read_trainer_outputs(data: dict[str, Any], name: str) -> TrainerOutputs:
    totals = RunTotals()
    env = Environment(framework="hf_trainer")
    notes: list[str] = []
    history = data.get("log_history") if is_trainer_state(data) else None
    entries: list[dict[str, Any]] = [e for e in (history or []) if isinstance(e, dict)]
    summary = next((e for e in reversed(entries) if "train_runtime" in e), None) or (
        data if is_results(data) else {}
    )

    totals.train_s = _num(summary.get("train_runtime"))
    totals.samples_per_s = _num(summary.get("train_samples_per_second"))
    flos = _num(data.get("total_flos")) or _num(summary.get("total_flos"))
    totals.hf_total_flos = flos if flos else None
    steps = data.get("global_step")
    if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0:
        totals.steps = steps
    elif totals.train_s and _num(summary.get("train_steps_per_second")):
        totals.steps = round(totals.train_s * float(summary["train_steps_per_second"])) or None

    tokens = _num(data.get("num_input_tokens_seen")) or _num(summary.get("num_input_tokens_seen"))
    logged = [e["num_tokens"] for e in entries if _num(e.get("num_tokens"))]
    if not tokens and logged:
        tokens = float(max(logged))
    totals.tokens = int(tokens) if tokens else None

    evals = [e for e in entries if _num(e.get("eval_runtime"))]
    if not evals and _num(data.get("eval_runtime")):
        evals = [data]
    if evals:
        totals.evals = len(evals)
        totals.eval_s = sum(float(e["eval_runtime"]) for e in evals)

    for key, attr in (
        ("eval_steps", "eval_steps"),
        ("save_steps", "save_steps"),
        ("logging_steps", "logging_steps"),
    ):
        value = data.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            setattr(env, attr, value)
    batch = data.get("train_batch_size")
    if isinstance(batch, int) and not isinstance(batch, bool) and batch > 0:
        env.micro_batch_size = batch
    if env.save_steps and totals.steps:
        totals.saves = totals.steps // env.save_steps
    max_steps = data.get("max_steps")  # the Trainer's computed total (epochs × steps per epoch included)
    if (
        is_trainer_state(data)
        and isinstance(max_steps, int)
        and not isinstance(max_steps, bool)
        and max_steps > 0
    ):
        env.total_steps, env.total_steps_from = max_steps, f"{name} max_steps"
    env.config_sources.append(name)
    negative = _negative(data, entries)
    if negative:
        notes.append(f"{name}: {negative} negative or non-finite runtimes, rates or counts ignored")
    if totals.train_s is None:
        notes.append(f"{name}: no train_runtime (a run still in progress?): rates need a runtime")
    if totals.tokens is None:
        notes.append(f"{name}: no token count (set include_num_input_tokens_seen=True to log one)")
    return TrainerOutputs(totals=totals, env=env, notes=notes)
