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

# dmon's short names -> (ActivitySample field, scale to pitstop's unit)
DMON_FIELDS: dict[str, tuple[str, float]] = {
    "SMACT": ("sm_active", 1.0),
    "SMOCC": ("sm_occupancy", 1.0),
    "TENSO": ("tensor_active", 1.0),
    "DRAMA": ("dram_active", 1.0),
    "GRACT": ("gr_active", 1.0),
    "GPUTL": ("util", 1.0),
    "POWER": ("power_w", 1.0),
    "TOTEC": ("energy_j", MJ),
    "PCITX": ("pcie_tx", 1.0),
    "PCIRX": ("pcie_rx", 1.0),
    "NVLTX": ("nvlink_tx", 1.0),
    "NVLRX": ("nvlink_rx", 1.0),
}
EXPORTER_FIELDS: dict[str, tuple[str, float]] = {
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active", 1.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("sm_occupancy", 1.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("tensor_active", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_active", 1.0),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gr_active", 1.0),
    "DCGM_FI_DEV_GPU_UTIL": ("util", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_j", MJ),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("pcie_tx", 1.0),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("pcie_rx", 1.0),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("nvlink_tx", 1.0),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("nvlink_rx", 1.0),
}
RATIOS = ("sm_active", "sm_occupancy", "tensor_active", "dram_active", "gr_active")
RANGES: dict[str, tuple[float, float]] = {
    **{name: (0.0, 1.0001) for name in RATIOS},
    "util": (0.0, 100.0),
    "power_w": (0.0, 1e5),
    "energy_j": (0.0, 1e15),
    **{name: (0.0, 1e13) for name in ("pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx")},
}

# the header names fields by dmon's short names (upper case, ≤ 8 characters): a YAML comment "# Entity ..." is not one
DMON_HEADER = re.compile(r"^[ \t]*#[ \t]*Entity(?:[ \t]+[A-Z][A-Z0-9_]{1,7})+[ \t]*\r?$", re.M)
EXPORTER_LINE = re.compile(r"^(?:# (?:HELP|TYPE) )?DCGM_FI_[A-Z0-9_]+[{\s]", re.M)
DMON_ROW = re.compile(r"^\s*([A-Za-z][A-Za-z-]*)\s+(\d+)\s+(.*)$")
SERIES = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+(-?\d+))?\s*$")
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
EPOCH = re.compile(r"^#?\s*(\d{9,11}(?:\.\d+)?)\s*$")
DATE_FORMS = ("%a %b %d %H:%M:%S %Z %Y", "%a %b %d %H:%M:%S %Y", "%Y-%m-%d %H:%M:%S", "%Y/%m/%d %H:%M:%S")


def dcgm_kind(head: str) -> str | None:
    """'dcgmi_dmon' or 'dcgm_exporter' from the first bytes of a text file, else None."""
    if DMON_HEADER.search(head[:4096]):
        return "dcgmi_dmon"
    if EXPORTER_LINE.search(head):
        return "dcgm_exporter"
    return None


@dataclass
class DcgmGpu:
    activity: GpuActivity
    name: str | None = None


@dataclass
class DcgmLog:
    gpus: list[DcgmGpu]
    notes: list[str] = field(default_factory=list)


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

    def add(self, gpu: DcgmGpu, sample: ActivitySample) -> None:
        self.samples += 1
        if self.samples > MAX_SAMPLES:
            raise IngestError(
                f"{self.path}: more than {MAX_SAMPLES:,} DCGM samples; keep a part of it (tail -n 200000)"
            )
        gpu.activity.samples.append(sample)

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
    """Either layout into per-GPU activity timelines, with a note for each kind of thing left out."""
    lines = _Lines(path)
    gpus = _read_dmon(path, lines) if kind == "dcgmi_dmon" else _read_exporter(path, lines)
    return _finish(path, gpus, lines)


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
        sample = ActivitySample(t=float(len(gpu.activity.samples)))
        for column, cell in zip(columns, cells, strict=True):
            known = DMON_FIELDS.get(column.upper())
            if known is None:
                continue
            gpus.listed.setdefault(gpu.activity.gpu, set()).add(known[0])
            setattr(sample, known[0], gpus.value(cell, *known))
        gpus.add(gpu, sample)
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
                    gpus.add(gpu, ActivitySample(t=at, **values))
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
        read = {n for s in act.samples for n in RANGES if getattr(s, n) is not None}
        act.unsupported = sorted(gpus.listed.get(act.gpu, set()) - read)
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


def activity_ranks(log_gpus: list[DcgmGpu]) -> list[RankProfile]:
    """Ranks for GPUs known only from DCGM: utilization and power become GPU samples (what every GPU rule
    reads), the counters the rank's activity."""
    ranks = []
    for i, gpu in enumerate(log_gpus):
        samples = [
            GpuSample(t=s.t, util=s.util, power_w=s.power_w)
            for s in gpu.activity.samples
            if s.util is not None or s.power_w is not None
        ]
        env = Environment(device=Device.CUDA, gpu_name=gpu.name or None, gpu_count=len(log_gpus))
        ranks.append(assemble_rank(i, env, gpu_samples=samples))
    return ranks


def attach_activity(ranks: list[RankProfile], log_gpus: list[DcgmGpu], notes: list[str]) -> None:
    """Each GPU's activity to the rank of the same position (traces' ranks, nvidia-smi's GPUs, or DCGM's own)."""
    for rank, gpu in zip(ranks, log_gpus, strict=False):
        rank.gpu_activity = gpu.activity
    if len(log_gpus) > len(ranks):
        notes.append(f"DCGM: {len(log_gpus) - len(ranks)} GPUs beyond the run's {len(ranks)} ranks left out")
