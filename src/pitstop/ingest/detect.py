"""What an artifact is, from its content (never its name): the first bytes, then the parsed keys."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pitstop.ingest.configs import config_kind
from pitstop.ingest.errors import IngestError
from pitstop.ingest.hf_outputs import is_results, is_trainer_state
from pitstop.ingest.nvidia_smi import looks_like_smi
from pitstop.ingest.readers import head, read_text
from pitstop.ingest.yamlsafe import load_yaml

TRACE_KEYS = re.compile(rb'"(traceEvents|deviceProperties|schemaVersion|distributedInfo)"\s*:')
PICKLE_START = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
ZIP_START = b"PK\x03\x04"


def expand(paths: list[Path]) -> list[tuple[Path, bool]]:
    """(file, found in a folder) for files named directly and the files inside named folders (sorted; hidden
    files skipped). A file found in a folder that is not an artifact is skipped, not an error."""
    files: list[tuple[Path, bool]] = []
    for path in paths:
        if path.is_dir():
            inside = sorted(
                p
                for p in path.rglob("*")
                if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
            )
            if not inside:
                raise IngestError(f"{path}: an empty folder")
            files += [(p, True) for p in inside]
        elif path.is_file():
            files.append((path, False))
        else:
            raise IngestError(f"{path}: no such file or folder")
    return files


def sniff(path: Path) -> tuple[str, Any]:
    """(kind, parsed document or None). Kinds: kineto_trace, nvidia_smi, trainer_state, trainer_results,
    model_config, deepspeed, accelerate, axolotl, llama_factory, hf_args, torch_pickle."""
    start = head(path)
    if not start.strip():
        raise IngestError(f"{path}: empty (or an unreadable gzip)")
    if start.startswith(PICKLE_START) or start.startswith(ZIP_START):
        return "torch_pickle", None
    stripped = start.lstrip()
    if stripped.startswith(b"{") and TRACE_KEYS.search(start):
        return "kineto_trace", None
    text_head = start.decode("utf-8", errors="replace")
    if looks_like_smi(text_head):
        return "nvidia_smi", None
    text = read_text(path)
    if _bare_numbers_csv(text):
        raise IngestError(
            f"{path}: looks like an nvidia-smi log written with noheader and nounits, whose columns "
            "cannot be told apart; keep the header (--format=csv or csv,nounits)"
        )
    data: Any = None
    if stripped.startswith((b"{", b"[")):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise IngestError(f"{path}: invalid JSON ({exc.args[0] if exc.args else exc})") from None
    else:
        data = load_yaml(text, str(path))
    if not isinstance(data, dict):
        raise IngestError(f"{path}: not a trace, an nvidia-smi log, Trainer output or a training config")
    if is_trainer_state(data):
        return "trainer_state", data
    if is_results(data):
        return "trainer_results", data
    if "model_type" in data and ("hidden_size" in data or "n_embd" in data or "text_config" in data):
        return "model_config", data
    kind = config_kind(data)
    if kind is None:
        raise IngestError(
            f"{path}: a {'JSON' if stripped[:1] in (b'{', b'[') else 'YAML'} file pitstop does not "
            "recognize (not a trace, Trainer output or known training config)"
        )
    return kind, data


def _bare_numbers_csv(text: str) -> bool:
    lines = [line for line in text.strip().splitlines()[:50] if line.strip()]
    if len(lines) < 2:
        return False
    widths = set()
    for line in lines:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 2 or not all(re.fullmatch(r"-?\d+(\.\d+)?", c) for c in cells):
            return False
        widths.add(len(cells))
    return len(widths) == 1
