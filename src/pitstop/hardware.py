"""Accelerator table: dense peak FLOP/s, memory and links, with the document each number comes from.

Peaks are *dense* (no 2:4 sparsity) tensor-core figures from the vendors' datasheets. Where a datasheet
gives only a sparse figure, the dense one is half of it, as the datasheet's footnote states. GeForce cards
are listed at their fp32-accumulate tensor rate (what training uses), which is half of the fp16-accumulate
headline number. An accelerator that is not in this table is "unknown": pitstop never guesses its peak.

Memory is the capacity the driver reports (``nvidia-smi --query-gpu=memory.total``, ``rocm-smi``), in MiB,
per variant: a "24 GB" L4 or A10G holds ~22.5 GiB, an "80 GB" H100 79.6 GiB; a datasheet's decimal
gigabytes are never read as GiB. A MIG slice (``... MIG 1g.10gb``) is its own device: its share of the
parent's SMs (``1g`` is 14 of the A100's 108 SMs, 16 of the H100's 132) and its own memory.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from pitstop.core.vocabulary import StrEnum
from pitstop.errors import PitstopError

PCIE_GBPS_PER_DIRECTION_X16: dict[int, float] = {3: 15.75, 4: 31.5, 5: 63.0, 6: 121.0}
"""Theoretical x16 bandwidth per direction, GB/s (PCI-SIG: 8, 16, 32, 64 GT/s with 128b/130b / FLIT)."""


class Generation(StrEnum):
    """A GPU's architecture: what sets how close real training gets to its peak (``plan/rate.py``)."""

    VOLTA = "volta"
    TURING = "turing"
    AMPERE = "ampere"
    ADA = "ada"
    HOPPER = "hopper"
    BLACKWELL = "blackwell"
    CDNA2 = "cdna2"
    CDNA3 = "cdna3"


@dataclass(frozen=True)
class GpuSpec:
    key: str
    vendor: str
    memory_mib: int  # what the driver reports as total memory
    peak_tflops: dict[str, float | None]  # dense peaks by compute dtype; None = not supported
    mem_bw_tbs: float
    pcie_gen: int
    patterns: tuple[str, ...]  # regexes matched against a normalized device name
    source: str
    mig: str | None = None  # the MIG profile ("1g.10gb") when this is a slice of the row's GPU
    generation: Generation | None = None
    board_w: float | None = None  # the board's default power limit (TDP), watts
    power_limit_w: float | None = None  # set by ``derated``: the cap its peaks were scaled to

    @property
    def memory_gib(self) -> float:
        return self.memory_mib / 1024

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 2**20

    def peak_flops(self, dtype: str) -> float | None:
        """Dense peak in FLOP/s for a compute dtype, or None when the GPU has no such path."""
        tflops = self.peak_tflops.get(dtype)
        return None if tflops is None else tflops * 1e12

    @property
    def pcie_gbps(self) -> float:
        return PCIE_GBPS_PER_DIRECTION_X16[self.pcie_gen]

    @property
    def has_fast_low_precision(self) -> bool:
        """True when bf16/fp16 or TF32 tensor math is much faster than plain fp32."""
        fp32 = self.peak_tflops.get("fp32") or 0.0
        best = max((v or 0.0) for k, v in self.peak_tflops.items() if k != "fp32")
        return best >= 2 * fp32


_NV_A100 = "NVIDIA A100 datasheet (2021): 312 TF BF16/FP16, 156 TF TF32, 19.5 TF FP32"
_NV_H100 = "NVIDIA H100 datasheet / Hopper whitepaper (2023); dense = half the sparse figures"

_AMP, _ADA, _HOP, _BW = Generation.AMPERE, Generation.ADA, Generation.HOPPER, Generation.BLACKWELL

# Board power (W) is the default power limit of the variant the row names (``nvidia-smi -q -d POWER``,
# "Default Power Limit"); None where the GPU shares a module budget with a CPU (GH200). ``derated`` scales
# the peaks of a GPU capped below it.
# fmt: off
# key          vendor   MiB      bf16    fp16    tf32   fp32   TB/s  PCIe  name patterns                      source  generation  W
_ROWS: tuple[tuple, ...] = (
    ("A100-40GB", "nvidia", 40960,  312,    312,    156,   19.5,  1.555, 4, (r"a100.*40\s*gb", r"a100(?!.*80)"), _NV_A100 + "; 1,555 GB/s; SXM4 400 W (PCIe 250 W)", _AMP, 400),
    ("A100-80GB", "nvidia", 81920,  312,    312,    156,   19.5,  2.039, 4, (r"a100.*80\s*gb",), _NV_A100 + "; 2,039 GB/s SXM (PCIe 1,935); SXM4 400 W (PCIe 300 W)", _AMP, 400),
    ("H100-SXM",  "nvidia", 81559,  989.4,  989.4,  494.7, 66.9,  3.35,  5, (r"h100.*sxm", r"h100.*hbm3", r"h100(?!.*(pcie|nvl|9[46]\s*gb))"), _NV_H100 + "; SXM5 3.35 TB/s, 700 W", _HOP, 700),
    ("H100-PCIe", "nvidia", 81559,  756.5,  756.5,  378,   51.2,  2.0,   5, (r"h100.*pcie",), _NV_H100 + "; PCIe 2.0 TB/s, 350 W", _HOP, 350),
    ("H100-NVL",  "nvidia", 95830,  835.5,  835.5,  417.5, 60,    3.9,   5, (r"h100.*nvl", r"h100.*94\s*gb"), "NVIDIA H100 NVL product brief (2024): 1,671 TF sparse BF16 → 835.5 dense, 835 TF sparse TF32, 60 TF FP32; 94 GB, 3.9 TB/s; 350–400 W", _HOP, 400),
    ("H200",      "nvidia", 143771, 989.4,  989.4,  494.7, 66.9,  4.8,   5, (r"(?<!g)h200(?!.*nvl)",), "NVIDIA H200 product page (2024): H100 SXM tensor peaks; 141 GB, 4.8 TB/s; SXM 700 W", _HOP, 700),
    ("H200-NVL",  "nvidia", 143771, 835.5,  835.5,  417.5, 60,    4.8,   5, (r"(?<!g)h200.*nvl",), "NVIDIA H200 product page (2024), NVL column: 1,671 TF sparse BF16 → 835.5 dense, 60 TF FP32; 141 GB, 4.8 TB/s; up to 600 W", _HOP, 600),
    ("GH200-144GB", "nvidia", 146831, 989.4, 989.4, 494.7, 66.9, 4.9,   5, (r"gh200.*14[14]\s*g",), "NVIDIA GH200 datasheet (2024): H100 SXM tensor peaks; 144 GB HBM3e, 4.9 TB/s; 450–1000 W module shared with the CPU", _HOP, None),
    ("GH200-96GB", "nvidia", 97871,  989.4,  989.4,  494.7, 66.9,  4.0,   5, (r"gh200", r"h100.*96\s*gb"), "NVIDIA GH200 datasheet (2023): H100 SXM tensor peaks; 96 GB HBM3, 4 TB/s; 450–1000 W module shared with the CPU", _HOP, None),
    ("B200",      "nvidia", 183359, 2250,   2250,   1100,  75,    7.7,   5, (r"b200",), "NVIDIA HGX B200 spec table: 4.5 PF sparse BF16 → 2.25 PF dense, 2.2 PF sparse TF32, 75 TF FP32; 180 GB, 7.7 TB/s; 1000 W", _BW, 1000),
    ("L4",        "nvidia", 23034,  121,    121,    60,    30.3,  0.3,   4, (r"\bl4\b",), "NVIDIA L4 product page: 242 TF sparse BF16, 120 TF sparse TF32, 30.3 TF FP32; 300 GB/s; 72 W", _ADA, 72),
    ("L40S",      "nvidia", 46068,  362.05, 362.05, 183,   91.6,  0.864, 4, (r"l40s",), "NVIDIA L40S datasheet: 362 TF dense BF16, 366 TF sparse TF32, 91.6 TF FP32; 864 GB/s; 350 W", _ADA, 350),
    ("RTX-6000-Ada", "nvidia", 49140, 364.2, 364.2, 182.1, 91.1,  0.96,  4, (r"rtx 6000 ada",), "NVIDIA RTX 6000 Ada datasheet: 1,457 TF sparse FP8 → 364.2 dense BF16 (FP32 accumulate at full rate), 91.1 TF FP32; 48 GB, 960 GB/s; 300 W", _ADA, 300),
    ("RTX-A6000", "nvidia", 49140,  154.8,  154.8,  77.4,  38.7,  0.768, 4, (r"rtx a6000", r"^a6000$"), "NVIDIA RTX A6000 datasheet: 309.7 TF sparse tensor → 154.8 dense BF16/FP16 (FP32 accumulate at full rate), 38.7 TF FP32; 48 GB, 768 GB/s; 300 W", _AMP, 300),
    ("A10G",      "nvidia", 23028,  70,     70,     35,    35,    0.6,   4, (r"a10g",), "NVIDIA/AWS A10G datasheet (2022): 70 TF BF16/FP16, 35 TF TF32, 35 TF FP32 dense; 600 GB/s; 300 W", _AMP, 300),
    ("RTX-3090",  "nvidia", 24576,  71,     71,     35.6,  35.6,  0.936, 4, (r"3090",), "NVIDIA GA102 whitepaper: 71 TF FP16 tensor with FP32 accumulate; 936 GB/s; 350 W", _AMP, 350),
    ("RTX-4090",  "nvidia", 24564,  165.2,  165.2,  82.6,  82.6,  1.008, 4, (r"4090",), "NVIDIA Ada whitepaper: 165 TF FP16 tensor with FP32 accumulate, 82.6 TF TF32; 1,008 GB/s; 450 W", _ADA, 450),
    ("V100-32GB", "nvidia", 32510,  None,   125,    None,  15.7,  0.9,   3, (r"v100.*32\s*gb",), "NVIDIA V100 datasheet (SXM2): 125 TF FP16 tensor, 15.7 TF FP32, no BF16/TF32; 900 GB/s; 300 W", Generation.VOLTA, 300),
    ("V100-16GB", "nvidia", 16160,  None,   125,    None,  15.7,  0.9,   3, (r"v100",), "NVIDIA V100 datasheet (SXM2): 125 TF FP16 tensor, 15.7 TF FP32, no BF16/TF32; 900 GB/s; 300 W", Generation.VOLTA, 300),
    ("T4",        "nvidia", 15360,  None,   65,     None,  8.1,   0.32,  3, (r"\bt4\b",), "NVIDIA T4 datasheet: 65 TF FP16 mixed precision, 8.1 TF FP32, no BF16/TF32; 320 GB/s; 70 W", Generation.TURING, 70),
    # torch sees each of the MI250X's two dies (GCDs) as one device: per-device figures are half the package's
    ("MI250X",    "amd",    65536,  191.5,  191.5,  None,  47.9,  1.6,   4, (r"mi250",), "AMD MI250X product page: 383 TF BF16/FP16, 95.7 TF FP32 matrix, 3.2 TB/s, 560 W per package of 2 GCDs", Generation.CDNA2, 280),
    ("MI300X",    "amd",    196608, 1307.4, 1307.4, 653.7, 163.4, 5.3,   5, (r"mi300x",), "AMD MI300X datasheet: 1,307.4 TF dense BF16/FP16, 653.7 TF TF32, 163.4 TF FP32; 5.3 TB/s; 750 W", Generation.CDNA3, 750),
)
# fmt: on

GPUS: tuple[GpuSpec, ...] = tuple(
    GpuSpec(
        key,
        vendor,
        mem,
        {"bf16": bf16, "fp16": fp16, "tf32": tf32, "fp32": fp32},
        bw,
        pcie,
        pats,
        src,
        generation=gen,
        board_w=watts,
    )
    for key, vendor, mem, bf16, fp16, tf32, fp32, bw, pcie, pats, src, gen, watts in _ROWS
)

_MIG = re.compile(r"\bmig\s+(\d)g\.(\d+)gb\b")
_MIG_SMS = {"A100": (14, 108), "H100": (16, 132), "H200": (16, 132), "GH200": (16, 132), "B200": (18, 148)}
"""SMs per MIG compute slice and on the full GPU (NVIDIA MIG user guide, "Supported MIG profiles")."""
MIG_MEMORY_SHARE = 0.95
"""A profile's "5gb" is its share of the parent's memory; the driver reports ~0.95 GiB per named GB
(1g.5gb: 4,864 MiB; 2g.10gb: 9,728 MiB). The probe reads the slice's real size from torch."""


def mig_slice(parent: GpuSpec, profile: str, slices: int, gb: int) -> GpuSpec:
    """The part of ``parent`` a MIG profile gets: its SMs' share of every peak, its own memory."""
    family = parent.key.split("-")[0]
    per_slice, total = _MIG_SMS.get(family, (1, 7))
    share = min(slices * per_slice / total, 1.0)
    peaks = {k: None if v is None else round(v * share, 2) for k, v in parent.peak_tflops.items()}
    return dataclasses.replace(
        parent,
        key=f"{parent.key} MIG {profile}",
        memory_mib=int(gb * 1024 * MIG_MEMORY_SHARE),
        peak_tflops=peaks,
        mem_bw_tbs=round(parent.mem_bw_tbs * min(slices / 8, 1.0), 3),  # memory slices: 1 of 8 per g
        patterns=(),
        source=f"{parent.source}; MIG {profile}: {slices * per_slice} of {total} SMs",
        mig=profile,
    )


POWER_EXPONENT = 1 / 3
"""Sustained clocks under a power cap scale as the cap's share of board power to this exponent: dynamic power
is ~ f·V², and in the DVFS range V rises with f, so P ~ f³ (an A100 capped at 250 of 400 W keeps ~86% of
its clock, an H100 at 500 of 700 W ~89%; NVIDIA's and published power-capping studies lose 10–15% there)."""

POWER_FLOOR_SHARE = 0.25
"""No GPU in the table accepts a limit below about a quarter of its board power (A100 SXM: 100 of 400 W)."""


class PowerLimitError(PitstopError):
    """A power limit no such GPU accepts (the CLI says it in one line)."""


def derated(spec: GpuSpec, watts: float | None) -> GpuSpec:
    """``spec`` with its peaks at the sustained clock of a ``watts`` power cap (``POWER_EXPONENT``).

    Memory bandwidth is left as it is: HBM's clock is not the one a cap lowers first. A cap at or above the
    board power changes nothing; a GPU whose board power is unknown cannot be derated.
    """
    if watts is None:
        return spec
    if not watts > 0:
        raise PowerLimitError(f"--power-limit {watts:g}: a power limit is a positive number of watts")
    if spec.board_w is None:
        raise PowerLimitError(f"{spec.key}: no board power in pitstop's table to derate it from")
    if watts >= spec.board_w:
        return spec
    if watts < POWER_FLOOR_SHARE * spec.board_w:
        raise PowerLimitError(
            f"--power-limit {watts:g} W: below what a {spec.key} accepts "
            f"(about {POWER_FLOOR_SHARE * spec.board_w:.0f}–{spec.board_w:.0f} W)"
        )
    share = (watts / spec.board_w) ** POWER_EXPONENT
    peaks = {k: None if v is None else round(v * share, 2) for k, v in spec.peak_tflops.items()}
    return dataclasses.replace(
        spec,
        peak_tflops=peaks,
        power_limit_w=float(watts),
        source=f"{spec.source}; capped at {watts:g} of {spec.board_w:g} W: peaks ×{share:.2f} (clocks ~ P^1/3)",
    )


EXPECTED_MFU = (0.40, 0.50)
"""The old fixed MFU range; ``plan/rate.py`` gives the expected MFU per GPU generation and setup. Kept as the
reference range of ``low_mfu_unexplained``'s floor."""


def _normalize(name: str) -> str:
    name = name.lower().replace("_", " ")
    name = re.sub(r"\b(nvidia|tesla|geforce|amd|instinct|radeon)\b", " ", name)
    return re.sub(r"\s+", " ", name.replace("-", " ")).strip()


def lookup_gpu(name: str | None) -> GpuSpec | None:
    """Find a GPU by a device name (``torch.cuda.get_device_name``, NVML) or a table key; None if unknown.

    A MIG slice ("NVIDIA A100-SXM4-40GB MIG 1g.5gb") is the parent's row cut to the slice (``mig_slice``).
    """
    if not name:
        return None
    for spec in GPUS:
        if name.strip().lower() == spec.key.lower():
            return spec
    normalized = _normalize(name)
    mig = _MIG.search(normalized)
    if mig is not None:
        parent = lookup_gpu(normalized[: mig.start()].strip())
        if parent is None:
            return None
        return mig_slice(parent, f"{mig.group(1)}g.{mig.group(2)}gb", int(mig.group(1)), int(mig.group(2)))
    for spec in GPUS:
        if any(re.search(p, normalized) for p in spec.patterns):
            return spec
    return None


def compute_dtype(param_dtype: str | None, autocast_dtype: str | None, tf32: bool | None) -> str | None:
    """The dtype matrix math runs in: autocast wins, then the parameters' dtype, then TF32 for fp32."""
    for dtype in (autocast_dtype, param_dtype):
        if dtype in ("bf16", "bfloat16"):
            return "bf16"
        if dtype in ("fp16", "float16", "half"):
            return "fp16"
    if param_dtype in ("fp32", "float32") or autocast_dtype in ("fp32", "float32"):
        return "tf32" if tf32 else "fp32"
    return None
