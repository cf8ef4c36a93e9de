"""Read back what trackers wrote, with no server: W&B's offline transaction log (a LevelDB-style log of
protobuf Records; wandb >= 0.19 ships no Python reader for it) and TensorBoard event files."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7  # W&B's file header, then LevelDB log blocks: crc(4) length(2) type(1) per chunk


def wandb_records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[1:4] == b"W&B", "not a W&B transaction log"
    pos, buf, out = HEADER, b"", []
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        if kind == 0 and length == 0:
            pos += left - 7
            continue
        buf += data[pos : pos + length]
        pos += length
        if kind in (1, 4):  # FULL or LAST
            record = pb.Record()
            record.ParseFromString(buf)
            out.append(record)
            buf = b""
    return out


def wandb_history(run_dir: Path, wait_s: float = 60.0) -> list[dict[str, Any]]:
    """Every ``run.log`` row of an offline run, values decoded from JSON. wandb-core may still be writing the
    file after ``finish()`` returns: read once its ``exit`` record is there (or ``wait_s`` has passed)."""
    (log,) = run_dir.glob("run-*.wandb")
    deadline = time.monotonic() + wait_s
    records = wandb_records(log)
    while not any(r.WhichOneof("record_type") == "exit" for r in records) and time.monotonic() < deadline:
        time.sleep(0.2)
        records = wandb_records(log)
    rows = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
            )
    return rows


def tensorboard_events(folder: Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc
