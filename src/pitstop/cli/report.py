"""``pitstop report``: any saved result to a self-contained HTML file and/or TensorBoard scalars."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pitstop.cli.errors import UserError
from pitstop.cli.outputs import Outputs


def read_result(path: Path) -> Any:
    """The saved document; a FIFO, device or folder is refused before it is opened (a FIFO would hang),
    and JSON nested beyond Python's recursion limit is one line, not a RecursionError."""
    from pitstop.regular import regular_problem

    problem = regular_problem(path) if not path.is_dir() else None
    if problem is not None:
        raise UserError(problem)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a folder; give the JSON file a pitstop command wrote") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read it ({exc})") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UserError(f"{path}: not JSON ({exc})") from None
    except RecursionError:
        raise UserError(f"{path}: JSON nested too deeply to be a pitstop result") from None


def run_report(path: Path, html: Path | None, tensorboard: Path | None) -> int:
    if html is None and tensorboard is None:
        raise UserError("nothing to do: give --html FILE and/or --tensorboard DIR")
    outputs = Outputs(html=html, tensorboard=tensorboard)
    outputs.check()
    outputs.write(read_result(path))
    return 0
