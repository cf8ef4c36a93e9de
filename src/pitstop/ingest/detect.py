"""What an artifact is, from its content (never its name): the first bytes, then the parsed keys."""

from __future__ import annotations

import csv
import os
import re
import stat
from pathlib import Path
from typing import Any

from pitstop.artifacts import IngestError, head, read_text
from pitstop.ingest.configs import config_kind
from pitstop.ingest.dcgm import dcgm_kind
from pitstop.ingest.documents import load_document
from pitstop.ingest.hf_outputs import is_results, is_trainer_state
from pitstop.ingest.logs import looks_like_log
from pitstop.ingest.nccl_log import looks_like_nccl
from pitstop.ingest.nvidia_smi import LOOKED_FOR, looks_like_smi
from pitstop.ingest.topology import looks_like_nvlink_status, looks_like_topo

TRACE_KEYS = re.compile(rb'"(traceEvents|deviceProperties|schemaVersion|distributedInfo)"\s*:')
# Trace Event Format's array form: a top-level array of objects, events by their phase key ("ph": "X")
EVENT_ARRAY_START = re.compile(rb"\[\s*\{")
EVENT_PHASE = re.compile(rb'"ph"\s*:\s*"')
UTF8_BOM = b"\xef\xbb\xbf"
PICKLE_START = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
ZIP_START = b"PK\x03\x04"


LOG_HEAD = 2**20  # a log is looked for in its first MiB when its first bytes did not say
MAX_FOLDER_FILES = 10_000  # a run leaves tens of files; a folder with more was not named on purpose


def _walk(folder: Path, notes: list[str]) -> list[Path]:
    """Regular files inside ``folder`` (hidden ones skipped), links kept only when they stay inside it."""
    root = folder.resolve()
    found: list[Path] = []
    for here, dirs, names in os.walk(folder):  # never descends into linked folders
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if name.startswith("."):
                continue
            path = Path(here) / name
            shown = path.relative_to(folder)
            if path.is_symlink():
                try:
                    target = path.resolve()
                except (OSError, RuntimeError):  # a loop of links
                    notes.append(f"skipped {shown}: a link that cannot be followed")
                    continue
                if not target.is_relative_to(root):
                    notes.append(f"skipped {shown}: a link to {target}, outside {folder}")
                    continue
            try:
                mode = path.stat().st_mode
            except OSError as exc:
                notes.append(f"skipped {shown}: {exc.strerror or exc}")
                continue
            if not stat.S_ISREG(mode):
                notes.append(f"skipped {shown}: not a regular file")
                continue
            found.append(path)
            if len(found) > MAX_FOLDER_FILES:
                raise IngestError(
                    f"{folder}: more than {MAX_FOLDER_FILES:,} files; name the run's artifacts or their folder"
                )
    return sorted(found)


def expand(paths: list[Path], notes: list[str] | None = None) -> list[tuple[Path, bool]]:
    """(file, found in a folder) for files named directly and the files inside named folders (sorted; hidden
    files skipped). A file found in a folder that is not an artifact is skipped, not an error; so is a link
    that leads outside the folder, and anything that is not a regular file (a FIFO, a device): each said in
    ``notes``. A file named directly is the user's choice and is read wherever a link leads."""
    notes = [] if notes is None else notes
    files: list[tuple[Path, bool]] = []
    for path in paths:
        if path.is_dir():
            inside = _walk(path, notes)
            if not inside:
                raise IngestError(f"{path}: an empty folder" + (f" ({notes[-1]})" if notes else ""))
            files += [(p, True) for p in inside]
        elif path.exists():
            files.append((path, False))  # sniff refuses what is not a regular file, in one line
        else:
            raise IngestError(f"{path}: no such file or folder")
    return files


def sniff(path: Path) -> tuple[str, Any, list[str]]:
    """(kind, parsed document or None, notes about the document). Kinds: kineto_trace, nvidia_smi,
    nvidia_smi_topo (``topo -m``), nvidia_smi_nvlink (``nvlink -s``), nccl_log (NCCL's INFO lines), dcgmi_dmon,
    dcgm_exporter, trainer_state, trainer_results, model_config, deepspeed, accelerate, axolotl,
    llama_factory, lightning, hf_args, training_log (a run's saved output: read line by line, never whole),
    torch_pickle, binary."""
    start = head(path)
    if not start.strip():
        raise IngestError(f"{path}: empty (or an unreadable gzip)")
    if start.startswith(PICKLE_START) or start.startswith(ZIP_START):
        return "torch_pickle", None, []
    stripped = start.removeprefix(UTF8_BOM).lstrip()
    if stripped.startswith(b"{") and TRACE_KEYS.search(start):
        return "kineto_trace", None, []
    if EVENT_ARRAY_START.match(stripped) and EVENT_PHASE.search(stripped):
        return "kineto_trace", None, []
    if b"\x00" in start[:8192]:
        return "binary", None, []  # weights (safetensors), NumPy arrays, images: not text at all
    text_head = start.decode("utf-8", errors="replace")
    if looks_like_topo(text_head):
        return "nvidia_smi_topo", None, []
    if looks_like_nvlink_status(text_head):
        return "nvidia_smi_nvlink", None, []
    dcgm = dcgm_kind(text_head)
    if dcgm is not None:
        return dcgm, None, []
    if looks_like_smi(text_head):
        return "nvidia_smi", None, []
    as_json = stripped.startswith((b"{", b"["))
    if looks_like_log(text_head):  # before reading it whole: a log may be any size (and may start with
        return "training_log", None, []  # the Trainer's printed {'loss': ...}, which is not JSON)
    if looks_like_nccl(text_head):  # NCCL_DEBUG_FILE's, or a job's output that starts with NCCL's init
        return "nccl_log", None, []
    text = read_text(path)
    if _bare_numbers_csv(text):
        raise IngestError(
            f"{path}: looks like an nvidia-smi log written with noheader and nounits, whose columns "
            "cannot be told apart; keep the header (--format=csv or csv,nounits)"
        )
    columns = _csv_header(text)
    if columns is not None:
        shown = ", ".join(c or "(unnamed)" for c in columns[:12]) + (" …" if len(columns) > 12 else "")
        raise IngestError(
            f"{path}: a CSV with columns {shown}: not a GPU log pitstop reads, no utilization column (looked "
            f"for {LOOKED_FOR['util']}, or DCGM's GRACT / 1001) and no memory-used column (looked for "
            f"{LOOKED_FOR['mem_used']}, or DCGM's FBUSD / 252)"
        )
    try:
        doc = load_document(text, str(path), as_json=as_json)
    except IngestError:
        if looks_like_log(text[:LOG_HEAD]):
            return "training_log", None, []  # a log whose first lines are not a log's (a model printed)
        raise
    data = doc.data
    unknown = not isinstance(data, dict) or (config_kind(data) is None and _plain_document(data))
    if unknown and not as_json and looks_like_log(text[:LOG_HEAD]):
        return "training_log", None, []  # "Epoch 1: loss 2.3" lines are a mapping to YAML
    if not isinstance(data, dict):
        raise IngestError(f"{path}: not a trace, an nvidia-smi log, Trainer output or a training config")
    if is_trainer_state(data):
        return "trainer_state", data, doc.notes
    if is_results(data):
        return "trainer_results", data, doc.notes
    if "model_type" in data and ("hidden_size" in data or "n_embd" in data or "text_config" in data):
        return "model_config", data, doc.notes
    kind = config_kind(data)
    if kind is None:
        raise IngestError(
            f"{path}: a {'JSON' if stripped[:1] in (b'{', b'[') else 'YAML'} file pitstop does not "
            "recognize (not a trace, Trainer output or known training config)"
        )
    return kind, data, doc.notes


def _bare_numbers_csv(text: str) -> bool:
    lines = [line for line in text[:65536].strip().splitlines()[:50] if line.strip()]
    if len(lines) < 2:
        return False
    widths = set()
    for line in lines:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 2 or not all(re.fullmatch(r"-?\d+(\.\d+)?", c) for c in cells):
            return False
        widths.add(len(cells))
    return len(widths) == 1


def _csv_header(text: str) -> list[str] | None:
    """The header of a comma-separated table (the same number of cells, two or more, on its first lines,
    the first of them names), else None: what a refusal names when the table is no log pitstop reads."""
    lines = [line for line in text[:65536].splitlines()[:20] if line.strip()]
    if len(lines) < 2 or lines[0].lstrip().startswith(("{", "[", "#", "-")):
        return None
    rows = list(csv.reader(lines))
    widths = {len(r) for r in rows}
    if len(widths) != 1 or len(rows[0]) < 2:
        return None
    header = [c.strip() for c in rows[0]]
    if any(re.fullmatch(r"-?\d+(\.\d+)?", c) for c in header) or any(": " in c for c in header):
        return None
    return header


def _plain_document(data: dict[str, object]) -> bool:
    """A mapping that is no known artifact (kept apart from the trainer outputs and model configs sniff knows)."""
    return not (is_trainer_state(data) or is_results(data) or "model_type" in data)
