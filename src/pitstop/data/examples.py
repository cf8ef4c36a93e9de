"""Reading fine-tuning examples from the files people keep them in, in the layouts people use.

Files: JSONL, JSON (a list, or an object holding one), Parquet, CSV, and Hugging Face ``datasets`` saved
with ``save_to_disk``. Layouts: chat ``messages`` ([{role, content}]), ShareGPT ``conversations``
([{from, value}]), Alpaca (instruction / input / output), prompt / completion (also question / answer,
prompt / response), and plain ``text``. Every example becomes a list of chat turns, so one renderer serves
all of them.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pitstop.data.errors import DataError
from pitstop.data.regular import check_regular

ROLE_NAMES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "bot": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
}


class ExampleError(DataError):
    """One example cannot be used (a bad line, a missing field): says which one."""


@dataclass
class Example:
    index: int  # position in the file (line number - 1 for JSONL)
    turns: list[tuple[str, str]]  # (role, content); role "text" for plain text
    layout: str


def _layout(record: dict[str, Any]) -> str | None:
    if isinstance(record.get("messages"), list):
        return "messages"
    if isinstance(record.get("conversations"), list):
        return "sharegpt"
    if "instruction" in record and ("output" in record or "response" in record):
        return "alpaca"
    for prompt, answer in (("prompt", "completion"), ("prompt", "response"), ("question", "answer")):
        if prompt in record and answer in record:
            return "prompt_completion"
    if "text" in record:
        return "text"
    return None


def to_turns(record: Any, where: str) -> tuple[list[tuple[str, str]], str]:
    if not isinstance(record, dict):
        raise ExampleError(f"{where}: an example must be a JSON object, not {type(record).__name__}")
    layout = _layout(record)
    if layout is None:
        keys = ", ".join(sorted(record)[:8]) or "none"
        raise ExampleError(
            f"{where}: no known fields (messages, conversations, instruction/output, prompt/"
            f"completion, question/answer, text); it has: {keys}"
        )
    turns: list[tuple[str, str]] = []
    if layout in ("messages", "sharegpt"):
        key, role_key, content_key = (
            ("messages", "role", "content") if layout == "messages" else ("conversations", "from", "value")
        )
        for turn in record[key]:
            if not isinstance(turn, dict) or not isinstance(turn.get(content_key), str):
                raise ExampleError(f"{where}: a turn without a text '{content_key}'")
            role = ROLE_NAMES.get(str(turn.get(role_key, "")).lower())
            if role is None:
                raise ExampleError(f"{where}: unknown role {turn.get(role_key)!r}")
            turns.append((role, turn[content_key]))
    elif layout == "alpaca":
        instruction = record.get("instruction")
        extra = record.get("input") or ""
        output = record.get("output", record.get("response"))
        if not isinstance(instruction, str) or not isinstance(output, str) or not isinstance(extra, str):
            raise ExampleError(f"{where}: instruction, input and output must be text")
        if record.get("system"):
            turns.append(("system", str(record["system"])))
        turns.append(("user", instruction + (f"\n\n{extra}" if extra else "")))
        turns.append(("assistant", output))
    elif layout == "prompt_completion":
        prompt = record.get("prompt", record.get("question"))
        answer = record.get("completion", record.get("response", record.get("answer")))
        if not isinstance(prompt, str) or not isinstance(answer, str):
            raise ExampleError(f"{where}: prompt and completion must be text")
        turns = [("user", prompt), ("assistant", answer)]
    else:
        if not isinstance(record["text"], str):
            raise ExampleError(f"{where}: 'text' must be a string")
        turns = [("text", record["text"])]
    if not turns or not any(content.strip() for _, content in turns):
        raise ExampleError(f"{where}: an empty example")
    if layout != "text" and not any(role == "assistant" and content.strip() for role, content in turns):
        raise ExampleError(f"{where}: no assistant answer to train on")
    return turns, layout


def _records(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, record) for every record of a file or a saved dataset."""
    if path.is_dir():
        try:
            import datasets
        except ImportError as exc:
            raise DataError("reading a saved dataset folder needs the `datasets` package") from exc
        try:
            data = datasets.load_from_disk(str(path))
        except Exception as exc:
            raise DataError(f"{path}: not a dataset saved with save_to_disk ({exc})") from None
        if isinstance(data, datasets.DatasetDict):
            data = data["train"] if "train" in data else next(iter(data.values()))
        for i, row in enumerate(data):
            yield f"{path} row {i}", row
        return
    suffix = "".join(path.suffixes[-2:]).lower()
    if suffix.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise DataError("reading Parquet needs pyarrow (pip install pyarrow)") from exc
        try:
            table = pq.read_table(path)
        except Exception as exc:
            raise DataError(f"{path}: not a Parquet file ({exc})") from None
        for i, row in enumerate(table.to_pylist()):
            yield f"{path} row {i}", row
        return
    if suffix.endswith(".csv"):
        with path.open(newline="", encoding="utf-8", errors="replace") as f:
            for i, row in enumerate(csv.DictReader(f), start=2):
                yield f"{path}:{i}", row
        return
    with path.open("rb") as f:
        first = f.read(1 << 16).lstrip()
    if first.startswith(b"[") or (
        suffix.endswith(".json") and first.startswith(b"{") and not _one_object_per_line(path)
    ):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise DataError(f"{path}: invalid JSON ({exc})") from None
        if isinstance(data, dict):
            data = next((v for v in data.values() if isinstance(v, list)), None)
            if data is None:
                raise DataError(f"{path}: a JSON object without a list of examples in it")
        for i, row in enumerate(data):
            yield f"{path} item {i}", row
        return
    with path.open(encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:  # handed on, so a caller that skips bad lines can go on reading
                record = ExampleError(f"{path}:{number}: not valid JSON ({exc.args[0] if exc.args else exc})")
            yield f"{path}:{number}", record


def _one_object_per_line(path: Path) -> bool:
    with path.open("rb") as f:
        lines = [line for _, line in zip(range(3), f, strict=False) if line.strip()]
    try:
        return len(lines) >= 2 and all(isinstance(json.loads(line), dict) for line in lines)
    except ValueError:
        return False


@dataclass
class ReadReport:
    examples: int = 0
    skipped: int = 0
    first_error: str | None = None
    layouts: dict[str, int] | None = None


def read_examples(path: Path, skip_bad: bool = False, report: ReadReport | None = None) -> Iterator[Example]:
    """Examples in file order. A bad one raises ExampleError (with its line), or is counted with skip_bad."""
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    if not path.is_dir():
        check_regular(path)  # a FIFO would block the open forever
    report = report if report is not None else ReadReport()
    report.layouts = report.layouts if report.layouts is not None else {}
    index = 0
    for where, record in _records(path):
        try:
            if isinstance(record, ExampleError):
                raise record
            turns, layout = to_turns(record, where)
        except ExampleError as exc:
            if not skip_bad:
                raise ExampleError(f"{exc} (use --skip-bad to skip and count such examples)") from None
            report.skipped += 1
            report.first_error = report.first_error or str(exc)
            index += 1
            continue
        report.examples += 1
        report.layouts[layout] = report.layouts.get(layout, 0) + 1
        yield Example(index=index, turns=turns, layout=layout)
        index += 1
