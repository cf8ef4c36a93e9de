"""DCGM's activity counters from text: ``dcgmi dmon -e ...`` output and ``dcgm-exporter`` scrapes.

Utilization (nvidia-smi's, NVML's) says only that some kernel ran during each sample period; DCGM's profiling
fields say how much of the GPU it used: SMs with a warp resident (SMACT, ``DCGM_FI_PROF_SM_ACTIVE``), warps
resident against the maximum (SMOCC), the tensor pipes' and the memory interface's busy shares (TENSO,
DRAMA). Both layouts are read line by line with a bounded line length and a bounded total, so a hostile
file costs at most ``DCGM_LIMIT`` bytes of reading and ``MAX_SAMPLES`` samples of memory.

- ``dcgmi dmon``: a header ``#Entity  SMACT  SMOCC ...`` (repeated every so often), a units/ID line, then a
  row per entity and sample, ``GPU 0  0.512  0.231 ...``; ``N/A`` where the GPU cannot count a field. dmon
  prints no time: samples are one ``-d`` apart (1 s by default) and are placed 1 apart by index.
- ``dcgm-exporter``: Prometheus text, ``DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-...",...} 0.45`` with
  ``# HELP`` / ``# TYPE`` lines; a file of several scrapes (``while true; do curl -s :9400/metrics; sleep 1;
  done``) is cut into scrapes where a series repeats, or at a time line written between them (``date``,
  ``date +%s``); a sample's own Prometheus timestamp (ms) wins over both.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import BinaryIO

from pitstop.artifacts import IngestError, open_binary
from pitstop.core.profile import (
    ActivitySample,
    Environment,
    GpuActivity,
    GpuSample,
    RankProfile,
    assemble_rank,
)
from pitstop.core.vocabulary import Device

DCGM_LIMIT = 256 * 2**20  # a day of 1 s scrapes of 8 GPUs is ~0.2 GB; refuse more rather than fill memory
MAX_LINE = 64 * 1024  # no DCGM line is longer; a longer one is skipped, never held whole
MAX_GPUS = 4096
MAX_SAMPLES = 1_000_000  # over all GPUs: ~240 bytes each in memory (11 days of 1 s samples of one GPU)
MJ = 1e-3  # DCGM's energy counter (field 156) counts millijoules
MIB = 2**20
IDLE_ENGINE = 0.05  # engine activity at or under which a sample did no work (as gpu_windows' 5 %)
GAP_MIN_S = 10.0  # a gap in the recorder's clock longer than this (and GAP_INTERVALS samples) ends a run
GAP_INTERVALS = 5
FREED_MIB = 512.0  # framebuffer use at or under this (or FREED_FRAC of it): no job holds the GPU
FREED_FRAC = 0.02
FREED_MIN_S = 10.0  # idle with memory freed this long: the job had exited; the next busy stretch is a new run
MIN_RUN_BUSY = 3  # samples of work a stretch needs to count as a run

# Every DCGM field pitstop reads: dmon's short name, its field id, dcgm-exporter's name, where it goes (an
# ActivitySample field, or one of EXTRAS, or IGNORED: recognized, not kept) and the scale to pitstop's unit.
FIELD_TABLE: tuple[tuple[str, int, str, str, float], ...] = (
    ("GRACT", 1001, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gr_active", 1.0),
    ("SMACT", 1002, "DCGM_FI_PROF_SM_ACTIVE", "sm_active", 1.0),
    ("SMOCC", 1003, "DCGM_FI_PROF_SM_OCCUPANCY", "sm_occupancy", 1.0),
    ("TENSO", 1004, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor_active", 1.0),
    ("DRAMA", 1005, "DCGM_FI_PROF_DRAM_ACTIVE", "dram_active", 1.0),
    ("FP64A", 1006, "DCGM_FI_PROF_PIPE_FP64_ACTIVE", "fp64_active", 1.0),
    ("FP32A", 1007, "DCGM_FI_PROF_PIPE_FP32_ACTIVE", "fp32_active", 1.0),
    ("FP16A", 1008, "DCGM_FI_PROF_PIPE_FP16_ACTIVE", "fp16_active", 1.0),
    ("PCITX", 1009, "DCGM_FI_PROF_PCIE_TX_BYTES", "pcie_tx", 1.0),
    ("PCIRX", 1010, "DCGM_FI_PROF_PCIE_RX_BYTES", "pcie_rx", 1.0),
    ("NVLTX", 1011, "DCGM_FI_PROF_NVLINK_TX_BYTES", "nvlink_tx", 1.0),
    ("NVLRX", 1012, "DCGM_FI_PROF_NVLINK_RX_BYTES", "nvlink_rx", 1.0),
    ("GPUTL", 203, "DCGM_FI_DEV_GPU_UTIL", "util", 1.0),
    ("MCUTL", 204, "DCGM_FI_DEV_MEM_COPY_UTIL", "mem_copy_util", 1.0),
    ("FBTTL", 250, "DCGM_FI_DEV_FB_TOTAL", "fb_total", 1.0),
    ("FBFRE", 251, "DCGM_FI_DEV_FB_FREE", "fb_free", 1.0),
    ("FBUSD", 252, "DCGM_FI_DEV_FB_USED", "fb_used", 1.0),
    ("POWER", 155, "DCGM_FI_DEV_POWER_USAGE", "power_w", 1.0),
    ("TOTEC", 156, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "energy_j", MJ),
    ("TMPTR", 150, "DCGM_FI_DEV_GPU_TEMP", "temp_c", 1.0),
    ("SMCLK", 100, "DCGM_FI_DEV_SM_CLOCK", "sm_clock", 1.0),
    ("MMCLK", 101, "DCGM_FI_DEV_MEM_CLOCK", "mem_clock", 1.0),
)
DMON_FIELDS: dict[str, tuple[str, float]] = {short: (name, scale) for short, _, _, name, scale in FIELD_TABLE}
EXPORTER_FIELDS: dict[str, tuple[str, float]] = {exp: (name, scale) for _, _, exp, name, scale in FIELD_TABLE}
FIELD_IDS: dict[str, tuple[str, float]] = {str(fid): (name, scale) for _, fid, _, name, scale in FIELD_TABLE}
ACTIVITY = ("sm_active", "sm_occupancy", "tensor_active", "dram_active", "gr_active", "util", "power_w",
            "energy_j", "pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx")  # fmt: skip
EXTRAS = (
    "fb_used",
    "fb_total",
    "fb_free",
    "sm_clock",
)  # kept beside the activity: GPU samples' memory, clock
RATIOS = ("sm_active", "sm_occupancy", "tensor_active", "dram_active", "gr_active", "fp64_active",
          "fp32_active", "fp16_active")  # fmt: skip
RANGES: dict[str, tuple[float, float]] = {
    **{name: (0.0, 1.0001) for name in RATIOS},
    "util": (0.0, 100.0),
    "mem_copy_util": (0.0, 100.0),
    "power_w": (0.0, 1e5),
    "energy_j": (0.0, 1e15),
    **{name: (0.0, 1e13) for name in ("pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx")},
    **{name: (0.0, 2.0**24) for name in ("fb_total", "fb_free", "fb_used")},  # MiB: 16 TiB
    "temp_c": (-50.0, 200.0),
    "sm_clock": (0.0, 1e5),
    "mem_clock": (0.0, 1e5),
}
# a CSV recorder's header: an entity column, a time column and fields by dmon's short name, id or exporter name
CSV_ENTITY = {"entityid", "entity", "entity_id", "gpu", "gpuid", "gpu_id", "gpu_index", "index", "device"}
CSV_TIME = {"timestamp", "time", "ts", "date", "datetime"}
# the header names fields by dmon's short names (upper case, ≤ 8 characters): a YAML comment "# Entity ..." is not one
DMON_HEADER = re.compile(r"^[ \t]*#[ \t]*Entity(?:[ \t]+[A-Z][A-Z0-9_]{1,7})+[ \t]*\r?$", re.M)
EXPORTER_LINE = re.compile(r"^(?:# (?:HELP|TYPE) )?DCGM_FI_[A-Z0-9_]+[{\s]", re.M)
DMON_ROW = re.compile(r"^\s*([A-Za-z][A-Za-z-]*)\s+(\d+)\s+(.*)$")
SERIES = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+(-?\d+))?\s*$")
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
EPOCH = re.compile(r"^#?\s*(\d{9,11}(?:\.\d+)?)\s*$")
DATE_FORMS = ("%a %b %d %H:%M:%S %Z %Y", "%a %b %d %H:%M:%S %Y", "%Y-%m-%d %H:%M:%S", "%Y/%m/%d %H:%M:%S")


def dcgm_kind(head: str) -> str | None:
    """'dcgmi_dmon', 'dcgm_exporter' or 'dcgm_csv' from the first bytes of a text file, else None."""
    if DMON_HEADER.search(head[:4096]):
        return "dcgmi_dmon"
    if EXPORTER_LINE.search(head):
        return "dcgm_exporter"
    first = head.lstrip("\ufeff").lstrip().split("\n", 1)[0]
    if _csv_roles(first) is not None:
        return "dcgm_csv"
    return None


def _csv_field(cell: str) -> tuple[str, float] | None:
    """A CSV column's DCGM field: by dmon's short name (GRACT), field id (1001) or exporter name."""
    name = cell.strip().strip('"').strip()
    upper = name.upper()
    return DMON_FIELDS.get(upper) or FIELD_IDS.get(name) or EXPORTER_FIELDS.get(upper)


def _csv_roles(header: str) -> list[str | tuple[str, float] | None] | None:
    """Each column's role in a DCGM recorder's CSV header ("entity", "time", a field), or None when the line
    is no such header: comma-separated, at least one DCGM field, and no cell that is a number only (a row)
    unless it is a field id beside another DCGM column."""
    if "," not in header or len(header) > MAX_LINE:
        return None
    cells = [c.strip().strip('"').strip() for c in header.rstrip("\r").split(",")]
    roles: list[str | tuple[str, float] | None] = []
    for cell in cells:
        low = cell.lower()
        if low in CSV_ENTITY:
            roles.append("entity")
        elif low in CSV_TIME:
            roles.append("time")
        else:
            roles.append(_csv_field(cell))
    named = [c for c, r in zip(cells, roles, strict=True) if isinstance(r, tuple) and not c.isdigit()]
    by_id = [c for c, r in zip(cells, roles, strict=True) if isinstance(r, tuple) and c.isdigit()]
    structural = [r for r in roles if r in ("entity", "time")]
    if named or (by_id and (structural or len(by_id) == len(cells))):
        if by_id and not named and not structural and len(by_id) < 2:
            return None
        return roles
    return None


@dataclass
class DcgmGpu:
    activity: GpuActivity
    name: str | None = None
    # beside each activity sample, what is not an activity counter: framebuffer used/total/free (MiB), SM clock
    extras: list[dict[str, float]] = field(default_factory=list)


@dataclass
class DcgmRun:
    """A stretch of the recording in which a job computed: recordings of several runs back to back are cut
    where the recorder stopped (a gap in its clock) or where the GPUs sat idle with their memory freed."""

    start: float
    end: float
    samples: int
    busy_s: float
    engine: float | None  # mean engine activity over the samples that computed, over the GPUs (0..1)
    fb_peak_mib: float | None
    fb_total_mib: float | None


@dataclass
class DcgmLog:
    gpus: list[DcgmGpu]
    notes: list[str] = field(default_factory=list)
    runs: list[DcgmRun] = field(default_factory=list)  # the runs found in a timed recording
    chosen: int | None = None  # which of them (from 1) the GPUs' samples were cut to, when several


class _Lines:
    """Lines of a (maybe gzipped) file, each at most MAX_LINE bytes, the whole at most DCGM_LIMIT."""

    def __init__(self, path: Path) -> None:
        self.path, self.read, self.too_long = path, 0, 0

    def __iter__(self) -> _LineIter:
        return _LineIter(self, open_binary(self.path))


class _LineIter:
    def __init__(self, owner: _Lines, stream: BinaryIO) -> None:
        self.owner, self.stream = owner, stream

    def __iter__(self) -> _LineIter:
        return self

    def __next__(self) -> str:
        owner = self.owner
        while True:
            try:
                line = self.stream.readline(MAX_LINE)
            except (EOFError, OSError) as exc:
                self.stream.close()
                raise IngestError(f"{owner.path}: truncated or corrupt ({exc})") from None
            if not line:
                self.stream.close()
                raise StopIteration
            owner.read += len(line)
            if owner.read > DCGM_LIMIT:
                self.stream.close()
                raise IngestError(
                    f"{owner.path}: more than {DCGM_LIMIT // 2**20} MiB of DCGM output; keep a part of it "
                    "(tail -n 200000)"
                )
            if len(line) >= MAX_LINE and not line.endswith(b"\n"):
                owner.too_long += 1
                self._skip_rest()
                continue
            return line.decode("utf-8", errors="replace").rstrip("\r\n")

    def _skip_rest(self) -> None:
        while True:
            chunk = self.stream.readline(MAX_LINE)
            self.owner.read += len(chunk)
            if self.owner.read > DCGM_LIMIT:
                raise IngestError(f"{self.owner.path}: more than {DCGM_LIMIT // 2**20} MiB of DCGM output")
            if not chunk or chunk.endswith(b"\n"):
                return


class _Gpus:
    """The GPUs met so far, their samples, and what was left out; bounded in GPUs and samples."""

    def __init__(self, path: Path, source: str) -> None:
        self.path, self.source = path, source
        self.by_key: dict[str, DcgmGpu] = {}
        self.listed: dict[str, set[str]] = {}  # per GPU, the fields the source listed
        self.samples = 0
        self.beyond = 0
        self.out_of_range = 0
        self.skipped = 0  # lines that did not fit the layout

    def gpu(self, key: str, name: str | None = None) -> DcgmGpu | None:
        found = self.by_key.get(key)
        if found is None:
            if len(self.by_key) >= MAX_GPUS:
                self.beyond += 1
                return None
            found = self.by_key[key] = DcgmGpu(GpuActivity(source=self.source, gpu=key), name)
        return found

    def add(self, gpu: DcgmGpu, t: float, values: dict[str, float | None]) -> None:
        """One sample: the activity counters into the GPU's activity, memory and clock beside it."""
        self.samples += 1
        if self.samples > MAX_SAMPLES:
            raise IngestError(
                f"{self.path}: more than {MAX_SAMPLES:,} DCGM samples; keep a part of it (tail -n 200000)"
            )
        gpu.activity.samples.append(ActivitySample(t=t, **{k: v for k, v in values.items() if k in ACTIVITY}))
        gpu.extras.append({k: v for k, v in values.items() if k in EXTRAS and v is not None})

    def value(self, text: str, name: str, scale: float) -> float | None:
        """The number in a cell, scaled to pitstop's unit; None for N/A and for what is out of range."""
        v = text.strip()
        if not v or v.upper() in ("N/A", "NA", "NAN", "-"):
            return None
        try:
            number = float(v) * scale
        except ValueError:
            return None
        low, high = RANGES[name]
        if not low <= number <= high or number != number:
            self.out_of_range += 1
            return None
        return min(number, 1.0) if name in RATIOS else number


def read_dcgm(path: Path, kind: str) -> DcgmLog:
    """Any layout into per-GPU activity timelines, with a note for each kind of thing left out; a
    recording of several runs cut into them, the rules then reading one (``_runs``)."""
    lines = _Lines(path)
    if kind == "dcgm_csv":
        gpus = _read_csv(path, lines)
    elif kind == "dcgmi_dmon":
        gpus = _read_dmon(path, lines)
    else:
        gpus = _read_exporter(path, lines)
    log = _finish(path, gpus, lines)
    _runs(path.name, log)
    return log


def _stamp(text: str) -> float | None:
    """Seconds since the epoch from a recorder's time cell: epoch s / ms / µs (DCGM's own clock is µs), or
    a date."""
    v = text.strip().strip('"')
    try:
        number = float(v)
    except ValueError:
        return _time_line(v)
    if number != number or number <= 0:
        return None
    for scale in (1e15, 1e12):  # µs, ms since the epoch
        if number > scale / 10:
            return number / (1e6 if scale == 1e15 else 1e3)
    return number


def _read_csv(path: Path, lines: _Lines) -> _Gpus:
    """A recorder's CSV of dmon fields: ``EntityId,GRACT,FBUSD,TimeStamp``, or field ids / exporter names as
    column names; one row per entity and sample. Without an entity column every row is GPU 0; without a
    time column samples are one interval apart by index."""
    gpus = _Gpus(path, "dcgmi dmon (CSV)")
    roles: list[str | tuple[str, float] | None] | None = None
    t0: float | None = None
    timed = False
    for line in lines:
        if not line.strip():
            continue
        if roles is None:
            roles = _csv_roles(line.lstrip("\ufeff"))
            if roles is None:
                raise IngestError(f"{path}: a CSV without DCGM field columns in its first line")
            continue
        cells = [c.strip().strip('"') for c in line.split(",")]
        if len(cells) != len(roles):
            gpus.skipped += 1
            continue
        key, t, values = "0", None, {}
        for role, cell in zip(roles, cells, strict=True):
            if role == "entity":
                key = (cell.strip() or "0")[:100]
            elif role == "time":
                t = _stamp(cell)
            elif isinstance(role, tuple):
                values[role[0]] = gpus.value(cell, *role)
        if "time" in roles and t is None:
            gpus.skipped += 1
            continue
        gpu = gpus.gpu(key)
        if gpu is None:
            continue
        for role in roles:
            if isinstance(role, tuple):
                gpus.listed.setdefault(key, set()).add(role[0])
        if t is not None:
            timed = True
            t0 = t if t0 is None else t0
        gpus.add(
            gpu, (t - t0) if (t is not None and t0 is not None) else float(len(gpu.activity.samples)), values
        )
    if not gpus.by_key:
        raise IngestError(f"{path}: a DCGM CSV without sample rows (only its header)")
    for gpu in gpus.by_key.values():
        gpu.activity.timed = timed
    return gpus


def _read_dmon(path: Path, lines: _Lines) -> _Gpus:
    gpus = _Gpus(path, "dcgmi dmon")
    columns: list[str] = []
    skipped = 0
    error = ""
    for line in lines:
        if DMON_HEADER.match(line):
            columns = line.split("Entity", 1)[1].split()
            columns = columns[1:] if columns[:1] == ["ID"] else columns  # "#Entity ID SMACT ..." in one line
            continue
        m = DMON_ROW.match(line)
        if m is None or not columns:
            if line.strip().lower().startswith("error"):
                error = error or line.strip()[:200]
            continue  # the units/ID line, blank lines
        cells = m.group(3).split()
        if len(cells) != len(columns):
            skipped += 1
            continue
        gpu = gpus.gpu(m.group(1).upper() + " " + m.group(2) if m.group(1).upper() != "GPU" else m.group(2))
        if gpu is None:
            continue
        values: dict[str, float | None] = {}
        for column, cell in zip(columns, cells, strict=True):
            known = DMON_FIELDS.get(column.upper())
            if known is None:
                continue
            gpus.listed.setdefault(gpu.activity.gpu, set()).add(known[0])
            values[known[0]] = gpus.value(cell, *known)
        gpus.add(gpu, float(len(gpu.activity.samples)), values)
    if not gpus.by_key:
        why = f": {error}" if error else " (no '#Entity' header followed by GPU rows)"
        raise IngestError(f"{path}: dcgmi dmon output without samples{why}")
    gpus.skipped += skipped
    return gpus


def _labels(text: str | None) -> dict[str, str]:
    return dict(LABEL.findall(text or "")[:64])


def _time_line(line: str) -> float | None:
    """Seconds since the epoch from a line a scrape loop wrote between scrapes (``date``, ``date +%s``)."""
    v = line.strip().lstrip("#").strip()
    m = EPOCH.match(v)
    if m:
        return float(m.group(1))
    for form in DATE_FORMS:
        try:
            return datetime.strptime(v, form).timestamp()
        except ValueError:
            continue
    try:
        return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp() if "T" in v else None
    except ValueError:
        return None


@dataclass
class _Scrape:
    """The scrape being read: each GPU's values so far, and its time if the file gave one."""

    values: dict[str, dict[str, float | None]] = field(default_factory=dict)
    seen: set[tuple[str, str]] = field(default_factory=set)
    t: float | None = None
    names: dict[str, str] = field(default_factory=dict)


def _read_exporter(path: Path, lines: _Lines) -> _Gpus:
    gpus = _Gpus(path, "dcgm-exporter")
    scrape, pending_t = _Scrape(), None
    index, t0, timed = 0, None, False
    skipped = 0

    def close() -> None:
        nonlocal scrape, index, t0, timed
        if scrape.values:
            t = scrape.t
            if t is not None:
                timed = True
                t0 = t if t0 is None else t0
            for key, values in scrape.values.items():
                gpu = gpus.gpu(key, scrape.names.get(key))
                if gpu is not None:
                    at = (t - t0) if (t is not None and t0 is not None) else float(index)
                    gpus.add(gpu, at, values)
            index += 1
        scrape = _Scrape()

    for line in lines:
        if not line.strip() or line.startswith(("# HELP", "# TYPE")):
            continue
        m = SERIES.match(line)
        if m is None or line.startswith("#"):
            t = _time_line(line)
            if t is not None:
                close()
                pending_t = t
            elif not line.startswith("#"):
                skipped += 1
            continue
        known = EXPORTER_FIELDS.get(m.group(1))
        if known is None:
            continue  # another exporter field (clocks, temperatures, XID errors): not read here
        labels = _labels(m.group(2))
        key = labels.get("gpu") or labels.get("UUID") or "0"
        if labels.get("GPU_I_ID"):
            key += f"/mig{labels['GPU_I_ID']}"
        key = key[:100]
        if (
            key not in gpus.by_key
            and key not in scrape.values
            and len(gpus.by_key) + len(scrape.values) >= MAX_GPUS
        ):
            gpus.beyond += 1  # counted before anything is kept: a file of 10⁶ "GPUs" stays cheap
            continue
        if (m.group(1), key) in scrape.seen:
            close()
        if scrape.t is None:
            stamp = m.group(4)
            scrape.t = int(stamp) / 1000 if stamp else pending_t
            pending_t = None
        scrape.seen.add((m.group(1), key))
        scrape.names.setdefault(key, labels.get("modelName", "")[:200])
        scrape.values.setdefault(key, {})[known[0]] = gpus.value(m.group(3), *known)
        gpus.listed.setdefault(key, set()).add(known[0])
    close()
    if not gpus.by_key:
        raise IngestError(f"{path}: a dcgm-exporter scrape without DCGM_FI_* samples pitstop reads")
    gpus.skipped += skipped
    for gpu in gpus.by_key.values():
        gpu.activity.timed = timed
    return gpus


def _finish(path: Path, gpus: _Gpus, lines: _Lines) -> DcgmLog:
    """The GPUs in order, each with the fields it listed but never read said as unsupported; the notes."""
    ordered = sorted(gpus.by_key.values(), key=lambda g: (len(g.activity.gpu), g.activity.gpu))
    notes: list[str] = []
    for gpu in ordered:
        act = gpu.activity
        read = {n for s in act.samples for n in ACTIVITY if getattr(s, n) is not None}
        read |= {n for extra in gpu.extras for n in extra}
        listed = gpus.listed.get(act.gpu, set()) & {*ACTIVITY, *EXTRAS}
        act.unsupported = sorted(listed - read)
        times = sorted({s.t for s in act.samples})
        gaps = sorted(b - a for a, b in pairwise(times))
        act.interval_s = gaps[len(gaps) // 2] if gaps and act.timed else None
    name = path.name
    if not any(n in gpus.listed.get(g.activity.gpu, set()) for g in ordered for n in RATIOS):
        notes.append(
            f"{name}: no profiling field (SM, tensor or DRAM activity) listed; watch 1002-1005 "
            "(dcgmi dmon -e 1001,1002,1003,1004,1005) or enable DCGM_FI_PROF_* in dcgm-exporter's counters"
        )
    unsupported = sorted({u for g in ordered for u in g.activity.unsupported})
    if unsupported:
        notes.append(f"{name}: {', '.join(unsupported)} N/A on this GPU or driver (not counted, not guessed)")
    if ordered and not ordered[0].activity.timed:
        notes.append(
            f"{name}: no time in the file; samples taken one interval apart (dmon's -d, 1 s by default)"
        )
    skipped = gpus.skipped + lines.too_long
    if skipped:
        notes.append(f"{name}: {skipped} lines skipped (cells that do not match the header, overlong lines)")
    if gpus.out_of_range:
        notes.append(
            f"{name}: {gpus.out_of_range} values out of range ignored (a ratio above 1, a negative value)"
        )
    if gpus.beyond:
        notes.append(f"{name}: more than {MAX_GPUS} GPUs; rows of the rest skipped")
    return DcgmLog(gpus=ordered, notes=notes)


def _engine(sample: ActivitySample) -> float | None:
    """How busy the GPU's engine was in a sample (0..1): GR engine active, else utilization, else SM active."""
    if sample.gr_active is not None:
        return sample.gr_active
    if sample.util is not None:
        return sample.util / 100
    return sample.sm_active


def _fb_total(extra: dict[str, float]) -> float | None:
    """The framebuffer's size in MiB: field 250, else used + free (252 + 251)."""
    if "fb_total" in extra:
        return extra["fb_total"]
    if "fb_used" in extra and "fb_free" in extra:
        return extra["fb_used"] + extra["fb_free"]
    return None


def _separators(log: DcgmLog, times: list[float], interval: float) -> list[tuple[float, float]]:
    """Spans between runs: gaps in the recorder's clock, and idle stretches in which every GPU's memory was
    freed (the job's process had exited) lasting ``FREED_MIN_S`` or more."""
    gap = max(GAP_MIN_S, GAP_INTERVALS * interval)
    spans = [(a, b) for a, b in pairwise(times) if b - a > gap]
    state: dict[float, bool] = {}  # per time: every GPU idle with its memory freed
    for gpu in log.gpus:
        for sample, extra in zip(gpu.activity.samples, gpu.extras, strict=True):
            engine, used = _engine(sample), extra.get("fb_used")
            total = _fb_total(extra)
            freed = used is not None and used <= max(FREED_MIB, FREED_FRAC * (total or 0.0))
            quiet = engine is not None and engine <= IDLE_ENGINE and freed
            state[sample.t] = state.get(sample.t, True) and quiet
    start: float | None = None
    last = times[0]
    for t in times:
        if state.get(t, False):
            start = t if start is None else start
            last = t
        else:
            if start is not None and last - start + interval >= FREED_MIN_S:
                spans.append((start, last))
            start = None
    if start is not None and last - start + interval >= FREED_MIN_S:
        spans.append((start, last))
    return sorted(spans)


def _run_stats(log: DcgmLog, lo: float, hi: float, interval: float) -> DcgmRun:
    engines, fb, totals, busy, count = [], [], [], 0, 0
    for gpu in log.gpus:
        mine = [(s, x) for s, x in zip(gpu.activity.samples, gpu.extras, strict=True) if lo <= s.t <= hi]
        count += len(mine)
        working = [e for s, _ in mine if (e := _engine(s)) is not None and e > IDLE_ENGINE]
        busy = max(busy, len(working))
        if working:
            engines.append(statistics.fmean(working))
        fb += [x["fb_used"] for _, x in mine if "fb_used" in x]
        totals += [t for _, x in mine if (t := _fb_total(x)) is not None]
    return DcgmRun(
        start=lo,
        end=hi,
        samples=count,
        busy_s=busy * interval,
        engine=statistics.fmean(engines) if engines else None,
        fb_peak_mib=max(fb) if fb else None,
        fb_total_mib=max(totals) if totals else None,
    )


def _runs(name: str, log: DcgmLog) -> None:
    """Cut a recording of several runs back to back into them (``DcgmRun``); with more than one, keep the
    samples of the least busy for the rules (a run that fills the GPU needs no batch advice; if the least
    busy one does not either, none does) and say every run's figures in a note."""
    times = sorted({s.t for g in log.gpus for s in g.activity.samples})
    if len(times) < 2:
        return
    interval = statistics.median(b - a for a, b in pairwise(times)) or 1.0
    bounds, lo = [], times[0]
    for a, b in _separators(log, times, interval):
        if a > lo:
            bounds.append((lo, a))
        lo = b
    if lo <= times[-1]:
        bounds.append((lo, times[-1]))
    runs = [r for a, b in bounds if (r := _run_stats(log, a, b, interval)).busy_s >= MIN_RUN_BUSY * interval]
    log.runs = runs
    if len(runs) < 2:
        return
    chosen = min(runs, key=lambda r: 2.0 if r.engine is None else r.engine)
    pick = runs.index(chosen) + 1
    for gpu in log.gpus:
        keep = [i for i, s in enumerate(gpu.activity.samples) if chosen.start <= s.t <= chosen.end]
        gpu.activity.samples = [gpu.activity.samples[i] for i in keep]
        gpu.extras = [gpu.extras[i] for i in keep]
    log.chosen = pick
    listed = "; ".join(f"{i}: {_run_words(r)}" for i, r in enumerate(runs, 1))
    log.notes.append(
        f"{name}: {len(runs)} runs found (cut where the recorder stopped or the GPU sat idle with its memory "
        f"freed); the rules read run {pick}, the least busy ({_run_words(chosen)}); each run: {listed}"
    )


def _run_words(run: DcgmRun) -> str:
    """'2 min busy, engine 65%, 4.2 GiB' for one run."""
    parts = [f"{run.busy_s / 60:.1f} min busy" if run.busy_s >= 60 else f"{run.busy_s:.0f} s busy"]
    if run.engine is not None:
        parts.append(f"engine {run.engine:.0%}")
    if run.fb_peak_mib is not None:
        of = f" of {run.fb_total_mib / 1024:.1f}" if run.fb_total_mib else ""
        parts.append(f"{run.fb_peak_mib / 1024:.1f}{of} GiB")
    return ", ".join(parts)


def activity_ranks(log_gpus: list[DcgmGpu]) -> list[RankProfile]:
    """Ranks for GPUs known only from DCGM: GPU samples (what every GPU rule reads) from utilization, else
    the GR engine's activity (field 1001: the share of time the engine was busy, what utilization measures,
    averaged over the period instead of sampled), with the framebuffer's use and size and the power; the
    counters stay the rank's activity."""
    ranks = []
    for i, gpu in enumerate(log_gpus):
        samples = []
        for s, extra in zip(gpu.activity.samples, gpu.extras, strict=True):
            util = s.util if s.util is not None else (None if s.gr_active is None else 100 * s.gr_active)
            used, total = extra.get("fb_used"), _fb_total(extra)
            if util is None and s.power_w is None and used is None:
                continue
            samples.append(
                GpuSample(
                    t=s.t,
                    util=util,
                    power_w=s.power_w,
                    mem_used=None if used is None else int(used * MIB),
                    mem_total=None if total is None else int(total * MIB),
                    sm_clock=extra.get("sm_clock"),
                )
            )
        env = Environment(device=Device.CUDA, gpu_name=gpu.name or None, gpu_count=len(log_gpus))
        ranks.append(assemble_rank(i, env, gpu_samples=samples))
    return ranks


def attach_activity(ranks: list[RankProfile], log_gpus: list[DcgmGpu], notes: list[str]) -> None:
    """Each GPU's activity to the rank of the same position (traces' ranks, nvidia-smi's GPUs, or DCGM's own)."""
    for rank, gpu in zip(ranks, log_gpus, strict=False):
        rank.gpu_activity = gpu.activity
    if len(log_gpus) > len(ranks):
        notes.append(f"DCGM: {len(log_gpus) - len(ranks)} GPUs beyond the run's {len(ranks)} ranks left out")
