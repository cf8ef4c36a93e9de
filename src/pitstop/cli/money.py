"""What the user pays: the price per GPU-hour (option or environment), and each finding's saving over the
rest of the run and the run's cost added to a diagnosis (``diagnose/savings.py``, ``diagnose/cost.py``),
shared by doctor, analyze, attach and watch."""

from __future__ import annotations

import os

from pitstop.cli.errors import UserError
from pitstop.diagnose import Diagnosis
from pitstop.diagnose.savings import (
    PRICE_ENV,
    TOTAL_STEPS_OPTION,
    parse_price,
    parse_total_steps,
)


def with_savings(diagnosis: Diagnosis, price: float | None, total_steps: int | None) -> None:
    """Each finding's time (and, with a price, money) saved over the rest of the run, and the run's cost at
    the price; where a saving cannot be given (the run's length unknown), the one note that says why."""
    diagnosis.add_savings(price, total_steps)


def resolve_price(given: str | float | None) -> float | None:
    """The price per GPU-hour: the option as the user typed it, else $PITSTOP_PRICE_PER_GPU_HOUR; a price that
    is not a positive number is refused in one line that quotes what was given."""
    try:
        return parse_price(os.environ.get(PRICE_ENV) if given is None else str(given))
    except ValueError as exc:
        where = "--price-per-gpu-hour" if given is not None else PRICE_ENV
        raise UserError(f"{where} {exc}", 2) from None


def resolve_total_steps(given: str | int | None) -> int | None:
    """The run's length the user gave (``--total-steps``, as typed), or None; one that is not a whole number of
    steps from 1 is refused in one line before anything runs."""
    try:
        return parse_total_steps(None if given is None else str(given))
    except ValueError as exc:
        raise UserError(f"{TOTAL_STEPS_OPTION} {exc}", 2) from None
