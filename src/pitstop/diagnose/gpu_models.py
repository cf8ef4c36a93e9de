"""Which GPU model each rank ran on, grouped: what every multi-rank report shows, and the mix ``mixed_gpus``
reads (``straggler`` reads it too, to leave a rank held back by its slower card to ``mixed_gpus``).

Every source names a rank's card in its own environment (``RankProfile.environment.gpu_name``: the probe from
``torch.cuda.get_device_name`` of the rank's device, a trace from the ``deviceProperties`` entry of the device
its kernels ran on, attach from NVML per process, an nvidia-smi or DCGM log per GPU). The run's environment is
the lowest rank's, so it names one card: a job on two kinds of card shows only here.

Pure functions of the RunProfile (and the cross-rank analysis): no torch, no measuring.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from pitstop.core.profile import RunProfile
from pitstop.diagnose.ranks import RanksAnalysis
from pitstop.hardware import GpuSpec, lookup_gpu
from pitstop.trace.crossrank import rank_ranges

PEAK_DTYPES = ("bf16", "fp16", "tf32", "fp32")  # the tensor peak compared when the run's dtype is unknown
SAME_PEAK = 1.05  # peaks within this ratio are the same speed on paper; memory bandwidth then decides


@dataclass(frozen=True)
class GpuGroup:
    """The ranks that ran on one GPU model."""

    name: str  # the device name as the source wrote it (the lowest rank's spelling)
    ranks: tuple[int, ...]
    spec: GpuSpec | None  # its row in pitstop's hardware table; None for a card the table does not know


def _key(name: str) -> str:
    """Spellings of one model that differ only in case or spacing are one model."""
    return " ".join(name.split()).lower()


def gpu_by_rank(profile: RunProfile) -> dict[int, str]:
    """Each rank's GPU model, for the ranks whose source named it."""
    return {
        r.rank: " ".join(name.split())
        for r in sorted(profile.ranks, key=lambda r: r.rank)
        if (name := r.environment.gpu_name) and name.strip()
    }


def gpu_groups(profile: RunProfile) -> list[GpuGroup]:
    """The ranks grouped by GPU model, in the order of each group's lowest rank."""
    names: dict[str, str] = {}
    members: dict[str, list[int]] = {}
    for rank, name in gpu_by_rank(profile).items():
        key = _key(name)
        names.setdefault(key, name)
        members.setdefault(key, []).append(rank)
    return [GpuGroup(names[k], tuple(members[k]), lookup_gpu(names[k])) for k in members]


def rank_span(ranks: list[int] | tuple[int, ...]) -> str:
    """Rank numbers as runs: "ranks 0-5, 7", "rank 3"."""
    return ("rank " if len(set(ranks)) == 1 else "ranks ") + rank_ranges(ranks)


def gpu_models_line(profile: RunProfile) -> str | None:
    """The GPU models of a multi-rank run in one line: "8× NVIDIA H100 80GB HBM3" when all ranks share one,
    "ranks 0-5: NVIDIA A100-SXM4-80GB · ranks 6-7: NVIDIA A100-PCIE-40GB" when they do not. None for a
    one-rank run or when no rank's source named its GPU."""
    if len(profile.ranks) < 2:
        return None
    groups = gpu_groups(profile)
    if not groups:
        return None
    named = {r for g in groups for r in g.ranks}
    unnamed = [r.rank for r in profile.ranks if r.rank not in named]
    if len(groups) == 1 and not unnamed:
        return f"{len(groups[0].ranks)}× {groups[0].name}"
    parts = [f"{rank_span(g.ranks)}: {g.name}" for g in groups]
    if unnamed:
        parts.append(f"{rank_span(unnamed)}: GPU not named")
    return " · ".join(parts)


def gpu_models_table(profile: RunProfile) -> dict[str, list[int]] | None:
    """Each GPU model and its ranks (the document's ``environment.gpu_models``); None for a one-rank run or
    when no rank's source named its GPU."""
    if len(profile.ranks) < 2:
        return None
    return {g.name: list(g.ranks) for g in gpu_groups(profile)} or None


@dataclass
class GpuMix:
    """A job whose ranks ran on more than one GPU model, and which model the others wait for.

    The slow model is the one whose ranks compute longest per step where that was measured per rank (own
    compute between collectives, or a trace's GPU kernel time), else the one with the lower tensor peak in
    pitstop's hardware table (memory bandwidth where the peaks are the same), else not known."""

    groups: list[GpuGroup]
    slow: GpuGroup | None  # the model the others wait for; None when neither measure nor table says
    fast: GpuGroup | None  # the fastest model
    slower_by: str | None  # "measured" or "hardware table"
    peak_dtype: str | None = None
    peak_tflops: dict[str, float] = field(default_factory=dict)  # model -> dense tensor peak in peak_dtype
    mem_bw_tbs: dict[str, float] = field(default_factory=dict)  # model -> memory bandwidth, TB/s
    peak_ratio: float | None = None  # fast model's tensor peak over the slow model's
    bandwidth_ratio: float | None = None  # fast model's memory bandwidth over the slow model's
    compute_ms: dict[int, float] = field(default_factory=dict)  # rank -> own compute per step, ms
    compute_source: str | None = None
    compute_ratio: float | None = None  # slow model's ranks' median compute over the fast model's
    compute_excess_frac: float | None = None  # that difference as a share of the step
    wait_frac: dict[int, float] = field(default_factory=dict)  # rank -> share of its step waiting for peers
    wait_source: str | None = None
    step_s: float | None = None  # the job's step (median rank), seconds

    @property
    def slow_ranks(self) -> tuple[int, ...]:
        return self.slow.ranks if self.slow is not None else ()

    @property
    def other_ranks(self) -> list[int]:
        """The ranks not on the slow model: they wait for it."""
        slow = set(self.slow_ranks)
        return sorted(r for g in self.groups for r in g.ranks if r not in slow)

    @property
    def others_wait_frac(self) -> float | None:
        """Mean share of their step the ranks on the faster models wait for peers (measured)."""
        values = [self.wait_frac[r] for r in self.other_ranks if r in self.wait_frac]
        return statistics.fmean(values) if values else None

    @property
    def spec_ratio(self) -> tuple[float, str] | None:
        """What the hardware table says the fast model gains over the slow one: the tensor-peak ratio, or the
        memory-bandwidth ratio where the peaks are the same, with which one it is."""
        if self.peak_ratio is not None and self.peak_ratio >= SAME_PEAK:
            return self.peak_ratio, f"{self.peak_dtype} tensor peak"
        if self.bandwidth_ratio is not None and self.bandwidth_ratio >= SAME_PEAK:
            return self.bandwidth_ratio, "memory bandwidth"
        return None


def _peak_dtype(specs: list[GpuSpec], dtype: str | None) -> str | None:
    """The run's compute dtype where every model has a peak for it, else the first that every model has."""
    for candidate in ((dtype,) if dtype else ()) + PEAK_DTYPES:
        if all(s.peak_tflops.get(candidate) for s in specs):
            return candidate
    return None


def _by_spec(groups: list[GpuGroup], dtype: str | None) -> tuple[GpuGroup, GpuGroup] | None:
    """(slowest, fastest) by the hardware table: tensor peak, then memory bandwidth where peaks are the same;
    None when a model is not in the table or all are the same on paper."""
    specs = [g.spec for g in groups]
    if any(s is None for s in specs):
        return None
    peak = _peak_dtype([s for s in specs if s is not None], dtype)

    def speed(g: GpuGroup) -> tuple[int, float]:
        assert g.spec is not None
        tflops = (g.spec.peak_tflops.get(peak) or 0.0) if peak else 0.0
        bucket = round(math.log(tflops) / math.log(SAME_PEAK)) if tflops > 0 else 0
        return bucket, g.spec.mem_bw_tbs

    ordered = sorted(groups, key=speed)
    if speed(ordered[0]) == speed(ordered[-1]):
        return None
    return ordered[0], ordered[-1]


def _measured_compute(
    profile: RunProfile, ranks: RanksAnalysis | None
) -> tuple[dict[int, float], str | None]:
    """Each rank's own compute per step in ms: forward + backward less time blocked in collectives (timed
    collectives), else its trace's GPU kernel time. A rank's plain forward + backward includes waiting for
    its peers (DDP waits inside backward), so it is not used."""
    if ranks is not None:
        timed = {r.rank: 1000 * r.compute_s for r in ranks.ranks if r.compute_s is not None}
        if len(timed) >= 2:
            return timed, "forward + backward less time blocked in collectives, from timed collectives"
    kernels = {
        r.rank: r.trace.breakdown_ms.kernel
        for r in profile.ranks
        if r.trace is not None and r.trace.breakdown_ms is not None and r.trace.breakdown_ms.kernel > 0
    }
    if len(kernels) >= 2:
        return kernels, "GPU compute kernel time per step, from traces"
    return {}, None


def _measured_wait(profile: RunProfile, ranks: RanksAnalysis | None) -> tuple[dict[int, float], str | None]:
    """Each rank's share of its step spent waiting at collectives for the last rank to arrive."""
    if ranks is not None:
        return (
            {r.rank: r.wait_s / r.step_s for r in ranks.ranks if r.step_s > 0},
            "timed collectives, clocks aligned on collective ends",
        )
    traced = {
        r.rank: min((r.trace.collective_wait_ms or 0.0) / (1000 * r.mean_step_s), 1.0)
        for r in profile.ranks
        if r.trace is not None and r.trace.collective_wait_ms is not None and r.mean_step_s
    }
    if len(traced) >= 2:
        return traced, "traces' collectives, clocks aligned on the ends of matching collectives"
    return {}, None


def gpu_mix(profile: RunProfile, ranks: RanksAnalysis | None, dtype: str | None = None) -> GpuMix | None:
    """The mix of GPU models of a multi-rank run; None when its ranks share one model (or name none).
    ``dtype``: the run's compute dtype, whose tensor peak is compared."""
    groups = gpu_groups(profile)
    if len(groups) < 2:
        return None
    compute, compute_source = _measured_compute(profile, ranks)
    waits, wait_source = _measured_wait(profile, ranks)
    medians = {
        g.name: statistics.median(compute[r] for r in g.ranks if r in compute)
        for g in groups
        if any(r in compute for r in g.ranks)
    }
    slow = fast = None
    slower_by = None
    if len(medians) == len(groups):
        ordered = sorted(groups, key=lambda g: medians[g.name])
        fast, slow, slower_by = ordered[0], ordered[-1], "measured"
    elif (paper := _by_spec(groups, dtype)) is not None:
        slow, fast = paper
        slower_by = "hardware table"
    steps = [r.mean_step_s for r in profile.ranks if r.mean_step_s]
    mix = GpuMix(
        groups=groups,
        slow=slow,
        fast=fast,
        slower_by=slower_by,
        compute_ms=compute,
        compute_source=compute_source,
        wait_frac=waits,
        wait_source=wait_source if waits else None,
        step_s=statistics.median(steps) if steps else None,
    )
    specs = [g.spec for g in groups if g.spec is not None]
    mix.peak_dtype = _peak_dtype(specs, dtype) if len(specs) == len(groups) else None
    for g in groups:
        if g.spec is not None:
            mix.mem_bw_tbs[g.name] = g.spec.mem_bw_tbs
            if mix.peak_dtype and (tflops := g.spec.peak_tflops.get(mix.peak_dtype)):
                mix.peak_tflops[g.name] = tflops
    if slow is not None and fast is not None:
        if slow.name in mix.peak_tflops and fast.name in mix.peak_tflops:
            mix.peak_ratio = mix.peak_tflops[fast.name] / mix.peak_tflops[slow.name]
        if slow.name in mix.mem_bw_tbs and fast.name in mix.mem_bw_tbs:
            mix.bandwidth_ratio = mix.mem_bw_tbs[fast.name] / mix.mem_bw_tbs[slow.name]
        if slow.name in medians and fast.name in medians and medians[fast.name] > 0:
            mix.compute_ratio = medians[slow.name] / medians[fast.name]
            if mix.step_s:
                excess = (medians[slow.name] - medians[fast.name]) / 1000 / mix.step_s
                mix.compute_excess_frac = min(max(excess, 0.0), 1.0)
    return mix


def mixed_models_words(profile: RunProfile) -> str | None:
    """The cards of a job that mixes GPU models, for where a report names the run's device: "6× NVIDIA
    A100-SXM4-80GB + 2× NVIDIA A100-PCIE-40GB"; None when its ranks share one model (or name none)."""
    groups = gpu_groups(profile)
    if len(groups) < 2:
        return None
    return " + ".join(f"{len(g.ranks)}× {g.name}" for g in groups)
