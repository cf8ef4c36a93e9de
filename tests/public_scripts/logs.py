"""Reading back what each public script logs itself, to hold pitstop's figures against them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any


def trainer_log(state_file: Path) -> list[dict[str, Any]]:
    """The per-step entries of a Trainer's ``trainer_state.json`` (``logging_steps=1``): full precision,
    unlike what the Trainer prints (4 significant digits)."""
    history = json.loads(state_file.read_text())["log_history"]
    return [entry for entry in history if "loss" in entry]


def trainer_losses(state_file: Path) -> list[tuple[int, float, float]]:
    return [(e["step"], e["loss"], e["grad_norm"]) for e in trainer_log(state_file)]


def trainer_window_tokens_per_s(state_file: Path, first: int, last: int) -> float:
    """Tokens per second over steps ``first``..``last``, from the Trainer's own log: with
    ``include_num_input_tokens_seen`` each step's entry holds the tokens seen so far and
    ``train_runtime``, the seconds since training began, taken right after that step. The difference of
    the entries that close step ``first - 1`` and step ``last`` is the window pitstop measures (its steps
    end at the optimizer step, a few calls earlier in the same place of every step)."""
    by_step = {e["step"]: e for e in trainer_log(state_file)}
    start, end = by_step[first - 1], by_step[last]
    tokens = end["num_input_tokens_seen"] - start["num_input_tokens_seen"]
    return float(tokens / (end["train_runtime"] - start["train_runtime"]))


_ACCELERATE_STEP = re.compile(
    r"epoch (\d+) - update step (\d+):: grad norm: (\S+) ::train loss: (\S+)$", re.MULTILINE
)
_ACCELERATE_EVAL = re.compile(r"epoch (\d+):: eval perplexity: (\S+) eval_loss: (\S+)$", re.MULTILINE)


def accelerate_example_losses(output: str) -> list[tuple[str, ...]]:
    """Every update's grad norm and loss (printed with Python's full repr), and each epoch's eval."""
    steps = [m.groups() for m in _ACCELERATE_STEP.finditer(output)]
    return steps + [m.groups() for m in _ACCELERATE_EVAL.finditer(output)]


_PERPLEXITY = re.compile(r"epoch (\d+): perplexity: (\S+)$", re.MULTILINE)


def no_trainer_perplexities(output: str) -> list[tuple[str, str]]:
    """run_clm_no_trainer logs no per-step loss: only each epoch's eval perplexity (full repr)."""
    return [(m.group(1), m.group(2)) for m in _PERPLEXITY.finditer(output)]


def padded_pairs(lengths: list[int], batch: int, accumulation: int, steps: range) -> list[tuple[int, int]]:
    """(input positions, real tokens) of each optimizer step in ``steps`` (1-based) of the accelerate
    example: each batch of ``batch`` rows in file order is padded to its longest row plus one, then
    shifted by one, so it holds ``batch * max`` input positions of which ``sum(lengths)`` are real; an
    update takes ``accumulation`` batches, an epoch the rows once."""
    per_epoch = len(lengths) // (batch * accumulation)
    counts = []
    for step in steps:
        update = (step - 1) % per_epoch
        total = real = 0
        for micro in range(accumulation):
            first = (update * accumulation + micro) * batch
            rows = lengths[first : first + batch]
            real += sum(rows)
            total += batch * max(rows)
        counts.append((total, real))
    return counts
