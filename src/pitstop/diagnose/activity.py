"""What the GPUs' activity counters say, read once for the rules that use them (not a rule itself).

Utilization is the share of time *some* kernel ran; the counters say how much of the GPU it used. Four
readings come out of them, each only when its counters were read:

- ``starved``: utilization reads high but the SMs are mostly empty (SM active under ``SM_LOW``, or occupancy
  under ``OCC_LOW``): kernels too small or too few to fill the GPU (``small_batch``, ``host_sync``);
- ``tensor_idle``: the tensor pipes do next to nothing while the SMs work: matrix math off the tensor cores
  (``no_mixed_precision``);
- ``tensor_busy``: the tensor pipes are clearly used (a config saying fp32 is then contradicted);
- ``memory_bound``: DRAM busy while the tensor pipes are not: elementwise and normalisation traffic, not
  matmuls, sets the pace (``unfused_kernels``, ``low_mfu_unexplained``).

Means are taken per GPU over the samples in which the job computed (engine or SM activity above
``BUSY``; a pause is not an empty SM), then over the GPUs that computed.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from pitstop.core.profile import ActivitySample, RankProfile, RunProfile

BUSY = 0.05  # engine (or SM) activity above which the job computed in a sample
SM_LOW = 0.5  # SM active under this while utilization reads ≥ 75 %: the SMs are mostly empty
OCC_LOW = 0.2  # resident warps under this share of the maximum: too little work per kernel
TENSOR_IDLE = 0.02  # tensor pipes under 2 % busy: no matmul runs on tensor cores
TENSOR_BUSY = 0.10
SM_WORKING = 0.2  # the SMs do enough that an idle tensor pipe means something
DRAM_HIGH = 0.5  # the memory interface busy half the time or more
TENSOR_LOW = 0.15
FIELDS = ("sm_active", "sm_occupancy", "tensor_active", "dram_active", "gr_active")


@dataclass
class Activity:
    """Counter means over the GPUs that computed (fractions), where they came from, and what was N/A."""

    source: str
    gpus: list[str]
    samples: int
    means: dict[str, float] = field(default_factory=dict)
    unsupported: list[str] = field(default_factory=list)

    def get(self, name: str) -> float | None:
        return self.means.get(name)

    @property
    def starved(self) -> bool:
        sm, occ = self.get("sm_active"), self.get("sm_occupancy")
        return (sm is not None and sm < SM_LOW) or (occ is not None and occ < OCC_LOW)

    @property
    def tensor_idle(self) -> bool:
        tensor, sm = self.get("tensor_active"), self.get("sm_active")
        return tensor is not None and tensor < TENSOR_IDLE and (sm is None or sm >= SM_WORKING)

    @property
    def tensor_busy(self) -> bool:
        tensor = self.get("tensor_active")
        return tensor is not None and tensor >= TENSOR_BUSY

    @property
    def memory_bound(self) -> bool:
        dram, tensor = self.get("dram_active"), self.get("tensor_active")
        return dram is not None and tensor is not None and dram >= DRAM_HIGH and tensor <= TENSOR_LOW

    def evidence(self) -> dict[str, object]:
        """The counters as a finding's evidence: each mean by its field name, the source, what was N/A."""
        out: dict[str, object] = {k: round(v, 3) for k, v in self.means.items()}
        out["activity_source"] = self.source
        out["activity_gpus"] = len(self.gpus)
        if self.unsupported:
            out["activity_unsupported"] = self.unsupported
        return out

    def words(self) -> str:
        """The counters in a few words: 'GR engine 97%, SM active 41%, occupancy 18%, tensor 0%, DRAM 61% (dcgmi
        dmon)' (the GR engine: busy at all, what utilization measures)."""
        names = {"gr_active": "GR engine", "sm_active": "SM active", "sm_occupancy": "occupancy",
                 "tensor_active": "tensor pipes", "dram_active": "DRAM"}  # fmt: skip
        parts = [f"{label} {self.means[k]:.0%}" for k, label in names.items() if k in self.means]
        return ", ".join(parts) + f" ({self.source})"


def _busy(sample: ActivitySample) -> bool:
    engine = sample.gr_active
    if engine is None and sample.util is not None:
        engine = sample.util / 100
    if engine is None:
        engine = sample.sm_active
    return engine is None or engine > BUSY


def read_activity(profile: RunProfile) -> Activity | None:
    """The run's counter means, or None when no rank carries activity samples with a counter in them."""
    per_gpu: dict[str, list[float]] = {name: [] for name in FIELDS}
    gpus: list[str] = []
    sources: set[str] = set()
    unsupported: set[str] = set()
    samples = 0
    for rank in profile.ranks:
        act = rank.gpu_activity
        if act is None:
            continue
        unsupported.update(act.unsupported)
        busy = [s for s in act.samples if _busy(s)]
        if not busy:
            continue
        gpus.append(act.gpu)
        sources.add(act.source)
        samples += len(busy)
        for name in FIELDS:
            values = [v for s in busy if (v := getattr(s, name)) is not None]
            if values:
                per_gpu[name].append(statistics.fmean(values))
    means = {name: statistics.fmean(v) for name, v in per_gpu.items() if v}
    if not means:
        return None
    return Activity(
        source=", ".join(sorted(sources)),
        gpus=gpus,
        samples=samples,
        means=means,
        unsupported=sorted(unsupported),
    )


def recorded_by_dcgm(rank: RankProfile) -> bool:
    """The rank's GPU samples came from a DCGM recording (its DCGM counters beside them), not nvidia-smi."""
    return rank.gpu_activity is not None and rank.gpu_activity.source.lower().startswith("dcgm")
