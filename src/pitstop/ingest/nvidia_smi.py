"""nvidia-smi CSV logs (``--query-gpu=... --format=csv[,noheader][,nounits] -l N``) into per-GPU timelines.

Any subset and order of columns. GPUs are told apart by ``index``, ``pci.bus_id`` or ``uuid`` when logged,
else by their position among the rows that share a timestamp. Without a header, columns are recognized by
their units ("%", "MiB", "W", "MHz", a timestamp, a GPU name); without a header *and* without units they
cannot be, and the file is refused with a one-line reason. Rows that do not fit (a locale that writes
decimal commas, a truncated last line) are skipped and counted.
"""

from __future__ import annotations

import csv
import functools
import io
import itertools
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

from pitstop.artifacts import IngestError, open_binary
from pitstop.core.profile import GpuSample

HEADER_HINTS = (
    "utilization.",
    "memory.",
    "timestamp",
    "power.",
    "clocks.",
    "temperature.",
    "pci.bus_id",
    "index",
)
MAX_GPUS = 4096  # more GPUs than any one log of one job holds; rows of further GPUs are skipped and counted
SMI_LIMIT = 512 * 2**20  # a week of 1 s samples of 8 GPUs is ~0.5 GB; refuse more rather than fill memory
# What a value can be; anything outside is a corrupt cell, dropped and counted (never a "-5 %" busy GPU).
RANGES = {
    "util": (0.0, 100.0),
    "mem": (0.0, 2.0**24),  # MiB: 16 TiB
    "power": (0.0, 1e5),  # W
    "clock": (0.0, 1e5),  # MHz
}
TIME_FORMATS = (
    "%Y/%m/%d %H:%M:%S.%f",
    "%Y/%m/%d %H:%M:%S",
    "%Y-%m-%d %H:%M:%S.%f",
    "%Y-%m-%d %H:%M:%S",
    "%d.%m.%Y %H:%M:%S.%f",  # a European log line (date written day first, with dots)
    "%d.%m.%Y %H:%M:%S",
)
TIME_FORMS = (
    "YYYY/MM/DD HH:MM:SS[.fff], ISO-8601 (YYYY-MM-DDTHH:MM:SS[.fff][Z|±HH:MM]) or DD.MM.YYYY HH:MM:SS"
)
MIB = 2**20
# memory columns in another unit than nvidia-smi's MiB (a converted log, another tool's CSV): to MiB
MEMORY_UNITS = {"kib": 1 / 1024, "mib": 1.0, "gib": 1024.0, "tib": 1024.0**2, "kb": 1e3 / MIB, "mb": 1e6 / MIB,
                "gb": 1e9 / MIB, "tb": 1e12 / MIB}  # fmt: skip


@dataclass
class GpuTimeline:
    key: str  # index, bus id or position
    name: str | None = None
    samples: list[GpuSample] = field(default_factory=list)


@dataclass
class SmiLog:
    gpus: list[GpuTimeline]
    interval_s: float | None
    skipped_rows: int = 0
    notes: list[str] = field(default_factory=list)


def looks_like_smi(head: str) -> bool:
    first = head.lstrip().splitlines()[0].lower() if head.strip() else ""
    if any(h in first for h in HEADER_HINTS) and "," in first:
        return True
    if "," in first:  # a recorder's own names: a utilization or memory column among them, by meaning
        roles = {_column_role(c) for c in next(csv.reader([first]), [])}
        if roles & {"util", "mem_used"} and roles & {"time", "index", "name", "mem_total", "power"}:
            return True
    # noheader: a row that starts with an nvidia-smi timestamp or carries its units
    return bool(re.match(r"\s*\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}", first)) or (
        "," in first and bool(re.search(r"\d+ (%|MiB)\s*(,|$)", first))
    )


# A recorder's own column names, by meaning: the name with its unit suffix cut off and every separator an
# underscore (``utilization_gpu_pct`` -> ``utilization_gpu``, ``GPU Util (%)`` -> ``gpu_util``).
SYNONYMS: dict[str, str] = {
    **dict.fromkeys(("utilization_gpu", "utilization", "util", "gpu_util", "gpu_utilization", "gpu_utilisation",
                     "utilization_gpu_percent", "gpu_usage", "gpu_busy"), "util"),
    **dict.fromkeys(("memory_used", "mem_used", "used_memory", "gpu_memory_used", "fb_used", "vram_used",
                     "memory_usage", "gpu_mem_used"), "mem_used"),
    **dict.fromkeys(("memory_total", "mem_total", "total_memory", "gpu_memory_total", "fb_total", "vram_total"),
                    "mem_total"),
    **dict.fromkeys(("gpu_id", "gpu", "index", "gpu_index", "idx", "device", "device_id", "gpu_idx"), "index"),
    **dict.fromkeys(("name", "gpu_name", "model", "gpu_model", "product_name"), "name"),
    **dict.fromkeys(("timestamp", "time", "ts", "date", "datetime", "time_stamp"), "time"),
    **dict.fromkeys(("power_draw", "power", "power_usage", "gpu_power", "power_draw_instant"), "power"),
    **dict.fromkeys(("clocks_sm", "clocks_current_sm", "sm_clock", "clock_sm", "sm_clock_mhz"), "sm_clock"),
    **dict.fromkeys(("uuid", "gpu_uuid"), "uuid"),
    **dict.fromkeys(("pci_bus_id", "bus_id"), "bus"),
    # recognized, not read: said so rather than taken for another column
    **dict.fromkeys(("utilization_memory", "utilization_mem", "mem_util", "memory_util", "mem_utilization"),
                    "ignored"),
    **dict.fromkeys(("temperature_gpu", "temperature", "temp", "gpu_temp", "temperature_memory"), "ignored"),
    **dict.fromkeys(("memory_free", "mem_free", "fan_speed", "pstate", "power_limit", "clocks_mem",
                     "clocks_current_memory", "clocks_gr", "clocks_current_graphics"), "ignored"),
}  # fmt: skip
UNIT_SUFFIX = re.compile(
    r"_(pct|percent|perc|ratio|frac|mib|mb|gib|gb|kib|kb|bytes|b|w|watts|mhz|c|celsius)$"
)
LOOKED_FOR = {
    "util": "utilization.gpu, utilization, util, gpu_util, utilization_gpu_pct",
    "mem_used": "memory.used, memory_used, mem_used, memory_used_mib / _mb",
}


def _meaning(name: str) -> tuple[str, str | None]:
    """A header cell as words joined by underscores and the unit its suffix or brackets name
    (``memory_used_mib`` -> ``("memory_used", "mib")``, ``GPU Util (%)`` -> ``("gpu_util", "%")``)."""
    n = name.strip().strip('"').lower()
    unit = None
    m = re.search(r"\s*[\[(]\s*([^\])]*?)\s*[\])]\s*$", n)
    if m:
        unit, n = m.group(1), n[: m.start()]
    n = re.sub(r"[^a-z0-9]+", "_", n).strip("_")
    m2 = UNIT_SUFFIX.search(n)
    if m2 and n[: m2.start()] in SYNONYMS:
        unit, n = unit or m2.group(1), n[: m2.start()]
    return n, unit


def _column_role(name: str) -> str | None:
    n = name.strip().lower()
    n = re.sub(r"\s*\[.*\]$", "", n)
    role = _smi_role(n)
    if role is not None:
        return role
    meaning = SYNONYMS.get(_meaning(name)[0])
    return None if meaning == "ignored" else meaning


def _smi_role(n: str) -> str | None:
    """nvidia-smi's own --query-gpu names."""
    roles = {
        "timestamp": "time",
        "name": "name",
        "index": "index",
        "pci.bus_id": "bus",
        "uuid": "uuid",
        "utilization.gpu": "util",
        "memory.used": "mem_used",
        "memory.total": "mem_total",
        "power.draw": "power",
        "clocks.sm": "sm_clock",
        "clocks.current.sm": "sm_clock",
        "clocks_event_reasons.active": "reasons",  # gpu_throttled (driver ≥ 535; the old name below)
        "clocks_throttle_reasons.active": "reasons",
        "clocks.applications.graphics": "app_clock",
        "clocks.applications.gr": "app_clock",
    }
    return roles.get(n)


def _infer_roles(row: list[str]) -> list[str | None]:
    """Column roles of a headerless row, from the units nvidia-smi prints."""
    roles: list[str | None] = []
    seen: set[str] = set()
    for value in row:
        v = value.strip()
        role: str | None = None
        if re.match(r"\d{4}[/-]\d{2}[/-]\d{2}[ T]|\d{2}\.\d{2}\.\d{4} ", v):
            role = "time"
        elif v.endswith(" %"):
            role = "util" if "util" not in seen else None
        elif re.search(r" [KMGT]i?B$", v):
            role = (
                "mem_used" if "mem_used" not in seen else ("mem_total" if "mem_total" not in seen else None)
            )
        elif v.endswith(" W"):
            role = "power"
        elif v.endswith(" MHz"):
            role = "sm_clock" if "sm_clock" not in seen else None
        elif re.match(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.\d", v):
            role = "bus"
        elif v.startswith("GPU-"):
            role = "uuid"
        elif re.search(r"(nvidia|tesla|geforce|quadro|rtx|a100|h100)", v, re.I):
            role = "name"
        if role:
            seen.add(role)
        roles.append(role)
    return roles


NUMBER = re.compile(r"(-?\d+(?:\.\d+)?)\s*(?:%|MiB|W|MHz|C)?")
TIME = re.compile(r"(\d{4})[/-](\d{2})[/-](\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?")


def _number(value: str) -> float | None:
    v = value.strip()
    if not v or v.startswith("[") or v.upper() in ("N/A", "NA"):
        return None  # [N/A], [Not Supported]
    m = NUMBER.fullmatch(v)
    return float(m.group(1)) if m else None


def _unit(header: str) -> str | None:
    """The unit a header names in brackets (``memory.used [GiB]`` -> ``gib``) or its suffix
    (``memory_used_mib`` -> ``mib``), lower-cased."""
    m = re.search(r"\[\s*([^\]]*?)\s*\]\s*$", header)
    return m.group(1).lower() if m else _meaning(header)[1]


MEMORY = re.compile(r"(-?\d+(?:\.\d+)?)\s*([KMGT]i?B)?", re.I)


class _Bad:
    """Counts cells whose number is outside what the column can hold, and memory in a unit not known."""

    def __init__(self) -> None:
        self.count = 0
        self.units: set[str] = set()  # memory units that could not be converted (the column is then left out)

    def memory(self, value: str, unit: str | None) -> float | None:
        """MiB, from a value in the unit it carries, else the header's, else nvidia-smi's MiB."""
        v = value.strip()
        if not v or v.startswith("[") or v.upper() in ("N/A", "NA"):
            return None
        m = MEMORY.fullmatch(v)
        if m is None:
            return None
        name = (m.group(2) or unit or "mib").lower()
        factor = MEMORY_UNITS.get(name)
        if factor is None:
            self.units.add(name)
            return None
        return self.ranged(float(m.group(1)) * factor, "mem")

    def __call__(self, value: str, what: str) -> float | None:
        number = _number(value)
        return None if number is None else self.ranged(number, what)

    def ranged(self, number: float, what: str) -> float | None:
        low, high = RANGES[what]
        if not low <= number <= high:
            self.count += 1
            return None
        return number


class _Capped(io.RawIOBase):
    """A stream that fails once more than ``limit`` bytes were read: the log's size bound, gzip or not."""

    def __init__(self, inner: BinaryIO, limit: int) -> None:
        self.inner, self.left = inner, limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.inner.read(min(len(buffer), self.left + 1))
        self.left -= len(data)
        if self.left < 0:
            raise _TooBig
        buffer[: len(data)] = data
        return len(data)


class _TooBig(Exception):
    pass


@functools.lru_cache(maxsize=256)  # every GPU's row of one sample repeats the timestamp
def _time(value: str) -> float | None:
    v = value.strip()
    m = TIME.fullmatch(v)
    if m:  # nvidia-smi's own form, without strptime's cost (a 400,000-row log spent 20 s there)
        try:
            y, mo, d, h, mi, sec = (int(x) for x in m.groups()[:6])
            micro = int(m.group(7).ljust(6, "0")) if m.group(7) else 0
            return datetime(y, mo, d, h, mi, sec, micro).timestamp()
        except (ValueError, OverflowError, OSError):
            return None
    for fmt in TIME_FORMATS:
        try:
            return datetime.strptime(v, fmt).timestamp()
        except (ValueError, OverflowError, OSError):
            continue
    try:  # ISO-8601: 2024-01-01T10:00:00.123, with Z or an offset (Python 3.11 reads them all)
        return datetime.fromisoformat(v).timestamp() if "T" in v else None
    except (ValueError, OverflowError, OSError):
        return None


def read_smi(path: Path) -> SmiLog:
    try:
        return _read_smi(path)
    except _TooBig:
        raise IngestError(
            f"{path}: more than {SMI_LIMIT // 2**20} MiB of log; keep a part of it (tail -n 200000)"
        ) from None


def _columns(path: Path, reader: Iterator[list[str]]) -> tuple[list[str], bool, list[str | None]]:
    """The first row, whether it is a header, and each column's role (from the header, else guessed from
    the values' units); an error when neither utilization nor memory is among them."""
    try:
        first = next(reader)
    except StopIteration:
        raise IngestError(f"{path}: empty file") from None
    except (EOFError, OSError, csv.Error) as exc:
        raise IngestError(f"{path}: truncated or corrupt ({exc})") from None
    named = [_column_role(c) for c in first]
    header = any(h in ",".join(first).lower() for h in HEADER_HINTS) or (
        any(named) and not any(_number(c) is not None or _time(c) is not None for c in first)
    )
    roles = named if header else _infer_roles(first)
    if "util" not in roles and "mem_used" not in roles:
        raise IngestError(f"{path}: {_refusal(first, header)}")
    return first, header, roles


def _refusal(first: list[str], header: bool) -> str:
    """What kind of file this is and what it lacks, in one line."""
    advice = "log with --query-gpu=timestamp,index,utilization.gpu,memory.used,memory.total --format=csv"
    if not header:
        return (
            f"a CSV of {len(first)} columns without a header whose values carry no units: not an nvidia-smi "
            f"log pitstop can read (its columns cannot be told apart); {advice}"
        )
    shown = [c.strip() or "(unnamed)" for c in first[:12]]
    more = f" and {len(first) - 12} more" if len(first) > 12 else ""
    return (
        f"a CSV with columns {', '.join(shown)}{more}: not a GPU log pitstop can read, no utilization column "
        f"(looked for {LOOKED_FOR['util']}) and no memory-used column (looked for {LOOKED_FOR['mem_used']}); "
        + advice
    )


@dataclass
class _Skipped:
    """Rows left out, by why: too many cells (decimal commas), too few, a timestamp not read, no number."""

    wider: int = 0
    narrower: int = 0
    bad_time: int = 0
    first_bad_time: str = ""
    no_value: int = 0

    @property
    def total(self) -> int:
        return self.wider + self.narrower + self.bad_time + self.no_value

    def reasons(self) -> list[str]:
        out = []
        if self.bad_time:
            out.append(
                f"{self.bad_time} with a timestamp pitstop cannot read ({self.first_bad_time[:40]!r}; "
                f"it reads {TIME_FORMS})"
            )
        if self.wider:
            out.append(
                f"{self.wider} with more cells than the header (a decimal-comma locale? log with LC_ALL=C)"
            )
        if self.narrower:
            out.append(f"{self.narrower} with fewer cells than the header (a truncated line?)")
        if self.no_value:
            out.append(f"{self.no_value} with neither a utilization nor a memory number")
        return out


def _log(
    path: Path,
    by_gpu: dict[str, GpuTimeline],
    times: list[float],
    skipped: _Skipped,
    beyond: int,
    bad: _Bad,
) -> SmiLog:
    """The GPUs in index order, the sampling interval, and a note for each kind of row or value left out."""
    gpus = sorted(by_gpu.values(), key=lambda g: (len(g.key), g.key))
    out_of_range = bad.count
    if not gpus:
        why = f" ({'; '.join(skipped.reasons())})" if skipped.total else ""
        raise IngestError(f"{path}: no readable rows{why}")
    log = SmiLog(gpus=gpus, interval_s=_interval(times, gpus), skipped_rows=skipped.total)
    if skipped.total:
        log.notes.append(f"{path.name}: {skipped.total} rows skipped: {'; '.join(skipped.reasons())}")
    if bad.units:
        log.notes.append(
            f"{path.name}: memory in {', '.join(sorted(bad.units))} is not a unit pitstop converts; "
            "memory left out (log it in MiB, nvidia-smi's own unit)"
        )
    if out_of_range:
        log.notes.append(
            f"{path.name}: {out_of_range} values out of range ignored (a utilization outside 0-100 %, a negative "
            "memory, power or clock)"
        )
    if beyond:
        log.notes.append(
            f"{path.name}: more than {MAX_GPUS} GPUs in one log; {beyond} rows of the GPUs after the first "
            f"{MAX_GPUS} skipped"
        )
    return log


def _read_smi(path: Path) -> SmiLog:
    bad = _Bad()
    with open_binary(path) as raw:
        capped = io.BufferedReader(_Capped(raw, SMI_LIMIT))
        text = io.TextIOWrapper(capped, encoding="utf-8", errors="replace", newline="")
        reader = csv.reader(text, skipinitialspace=True)
        first, header, roles = _columns(path, reader)
        units = [_unit(c) for c in first] if header else [None] * len(roles)
        mem_unit = units[roles.index("mem_used")] if "mem_used" in roles else None
        total_unit = units[roles.index("mem_total")] if "mem_total" in roles else None
        rows_iter = reader if header else itertools.chain([first], reader)
        by_gpu: dict[str, GpuTimeline] = {}
        order: dict[float, int] = defaultdict(int)
        skipped, beyond = _Skipped(), 0
        times: list[float] = []
        t0: float | None = None
        try:
            for row in rows_iter:
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) != len(roles):
                    if len(row) > len(roles):
                        skipped.wider += 1
                    else:
                        skipped.narrower += 1
                    continue
                cells = {role: row[i] for i, role in enumerate(roles) if role}
                named = (cells.get("index") or cells.get("bus") or cells.get("uuid") or "").strip()[:100]
                if named and named not in by_gpu and len(by_gpu) >= MAX_GPUS:
                    beyond += 1  # counted before any parsing: a log of 400,000 "GPUs" stays cheap
                    continue
                t = _time(cells["time"]) if "time" in cells else None
                if "time" in cells and t is None:
                    skipped.bad_time += 1
                    skipped.first_bad_time = skipped.first_bad_time or cells["time"].strip()
                    continue
                util = bad(cells.get("util", ""), "util")
                mem = bad.memory(cells.get("mem_used", ""), mem_unit)
                if util is None and mem is None:
                    skipped.no_value += 1
                    continue
                key = named
                if not key:
                    slot = t if t is not None else -1.0
                    key = f"#{order[slot]}" if t is not None else "#0"
                    order[slot] += 1
                timeline = by_gpu.get(key)
                if timeline is None:
                    if len(by_gpu) >= MAX_GPUS:
                        beyond += 1
                        continue
                    timeline = by_gpu[key] = GpuTimeline(
                        key=key, name=(cells.get("name") or "").strip()[:200] or None
                    )
                if t is not None:
                    t0 = t if t0 is None else t0
                    times.append(t)
                total = bad.memory(cells.get("mem_total", ""), total_unit)
                power = bad(cells.get("power", ""), "power")
                clock = bad(cells.get("sm_clock", ""), "clock")
                reasons = cells.get("reasons", "").strip()
                timeline.samples.append(
                    GpuSample(
                        t=(t - t0) if (t is not None and t0 is not None) else float(len(timeline.samples)),
                        util=util,
                        mem_used=None if mem is None else int(mem * MIB),
                        mem_total=None if total is None else int(total * MIB),
                        power_w=power,
                        sm_clock=clock,
                        clock_reasons=int(reasons, 16) if re.fullmatch(r"0x[0-9a-fA-F]+", reasons) else None,
                        app_clock=bad(cells.get("app_clock", ""), "clock"),
                    )
                )
        except (EOFError, OSError) as exc:
            raise IngestError(f"{path}: truncated or corrupt ({exc})") from None
        except csv.Error as exc:
            raise IngestError(f"{path}: not CSV that pitstop can read ({exc})") from None
    return _log(path, by_gpu, times, skipped, beyond, bad)


def _interval(times: list[float], gpus: list[GpuTimeline]) -> float | None:
    """The sampling interval: the median gap between one GPU's samples (each GPU's row of a sample carries
    its own time, a few ms apart, so the log's distinct times alone would read those ms as the interval)."""
    gaps = sorted(b.t - a.t for g in gpus for a, b in itertools.pairwise(g.samples) if b.t > a.t)
    if gaps and times:
        return gaps[len(gaps) // 2]
    return None
